"""What every engine that samples on another server shares: local tokenization, handles, a bounded
number of calls in flight, stats, a refusal found at the readiness check. Subclasses say how
branches travel (SGLang; OpenAI-compatible servers and llama.cpp, whose one call samples one
parameter set: `CompletionsEngine`)."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from egrm.aio import gather_or_cancel
from egrm.engines.base import (
    LIVE,
    BackendRejectedError,
    Branch,
    BranchParams,
    EngineBusyError,
    EngineStats,
    EngineUnavailableError,
    appended_ids,
    rank_of,
)
from egrm.engines.remote.client import BackendClient, NotServedError
from egrm.engines.remote.tokenizer import LocalTokenizer

log = logging.getLogger(__name__)

# Read by the served model's tokenizer and egrm's at readiness: digits, words, punctuation and
# non-ASCII, where two vocabularies part at once.
TOKENIZER_PROBE = "Is 2,756 = 52 * 53? Señor Zoë's naïve café: Yes. ✓"


@dataclass(frozen=True, slots=True)
class RemoteBranch:
    """A branch's whole context as the server saw it: prompt ids + the branch's own ids."""

    engine: int  # id() of the engine that sampled it
    ids: tuple[int, ...]


class RemoteEngine:
    KIND = "remote server"  # the backend in words, for logs and messages

    def __init__(
        self, tokenizer: LocalTokenizer, url: str, api_key: str = "", timeout_s: float = 120.0, max_queue: int = 1024
    ):
        """url: the backend's base URL; timeout_s bounds one call; max_queue the calls waiting."""
        self._tok = tokenizer
        self._client = BackendClient(self.KIND, url, api_key, timeout_s)
        self._ready_timeout_s = min(timeout_s, 10.0)
        self._max_queue = max_queue
        self._in_flight = 0
        self._stats = EngineStats()
        self._refusal: str | None = None  # why this backend cannot judge (found by ready())
        self._compared = False  # the server's tokenizer was compared with egrm's (once)

    @property
    def url(self) -> str:
        return self._client.url

    def encode_chat(self, messages: Sequence[dict[str, str]], after: int | None = None) -> list[int]:
        return self._tok.encode_chat(messages, after)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text)

    def count_tokens(self, text: str) -> int:
        return len(self.encode(text))

    def _prompt_ids(self, prefix: str | Sequence[int], branches: Sequence[BranchParams]) -> list[int]:
        """The prompt as token ids, checked against the model's context before any call."""
        if not branches:
            raise ValueError("branches must not be empty")
        ids = self.encode(prefix) if isinstance(prefix, str) else list(prefix)
        if not ids:
            raise ValueError("prefix must not be empty")
        self._tok.check_context(len(ids), branches)
        return ids

    def _contexts(
        self, handles: Sequence[Any], appended: str | Sequence[int], branches: Sequence[BranchParams]
    ) -> list[list[int]]:
        """Each branch's context followed by what is appended: what continuing it sends."""
        if len(handles) != len(branches):
            raise ValueError(f"got {len(handles)} handles for {len(branches)} branch params")
        ids = appended_ids(self.encode, appended)
        if not all(isinstance(h, RemoteBranch) and h.engine == id(self) for h in handles):
            raise ValueError("handles must come from this engine's sample()")
        contexts = [[*h.ids, *ids] for h in handles]
        self._tok.check_context(max(len(c) for c in contexts), branches)
        return contexts

    def release(self, handles: Sequence[Any]) -> None:
        """Nothing to free here: a handle is the branch's ids; the server's cache evicts its own."""

    def _refuse(self, why: str) -> None:
        """From now on, not ready, and every call fails with why (a 503 that says it)."""
        self._refusal = why
        log.error("%s", why)

    async def _compare_tokenizers(self, path: str, body: dict[str, Any]) -> bool:
        """Refuse a server whose model tokenizes TOKENIZER_PROBE otherwise than EGRM_MODEL's tokenizer:
        egrm sends token ids, which another vocabulary reads as other words, and every reward would
        be noise with no error anywhere. Asked once (body: the server's tokenize request for the
        probe; its answer's `tokens`); a server that does not serve `path`, or refuses the request
        (another release's fields), is taken as it is. False: no answer in time (asked again at the
        next check)."""
        if self._compared:
            return True
        try:
            answer = await self._client.post(path, body, self._ready_timeout_s)
        except (NotServedError, BackendRejectedError) as exc:
            log.warning("cannot compare the tokenizer of %s with egrm's: %s", self.url, exc)
            answer = None
        except (EngineUnavailableError, EngineBusyError):
            return False
        self._compared = True
        theirs = answer.get("tokens") if isinstance(answer, dict) else None
        mine = self.encode(TOKENIZER_PROBE)
        if isinstance(theirs, list) and theirs != mine:
            self._refuse(
                f"the model at {self.url} tokenizes text otherwise than EGRM_MODEL's tokenizer ({self._tok.name}): "
                f"{len(theirs)} tokens against {len(mine)} for the same probe. egrm sends token ids, so it would "
                "send other words: set EGRM_MODEL to the served model (a local folder with its tokenizer files)"
            )
        return True

    def _handle(self, context: Sequence[int], own_ids: Sequence[int]) -> RemoteBranch:
        return RemoteBranch(id(self), (*context, *self._tok.without_eos(list(own_ids))))

    @asynccontextmanager
    async def _slot(self, branches: int) -> AsyncIterator[None]:
        """Bound the calls waiting on the server, as the embedded engine bounds its queue. Every
        call to the backend passes here, so a refused backend is never called."""
        if self._refusal is not None:
            raise EngineUnavailableError(self._refusal)
        if self._in_flight >= self._max_queue:
            raise EngineBusyError(f"{self._in_flight} calls are waiting on the {self._client.kind} (EGRM_MAX_QUEUE)")
        self._in_flight += 1
        self._stats.batched_requests += 1
        self._stats.batched_branches += branches
        try:
            yield
        finally:
            self._in_flight -= 1

    def stats(self) -> EngineStats:
        self._stats.queue_depth = self._in_flight
        return self._stats

    async def close(self) -> None:
        await self._client.close()


class CompletionsEngine(RemoteEngine, ABC):
    """A backend whose one call samples n branches of one parameter set from one prompt."""

    @abstractmethod
    async def _complete(self, ids: list[int], p: BranchParams, n: int, rank: int = LIVE) -> list[Branch]:
        """n branches of p from the prompt ids, in one server call; rank: what the work is (rank_of),
        for a server that schedules by priority."""

    async def continue_branches(
        self,
        handles: Sequence[Any],
        appended: str | Sequence[int],
        branches: Sequence[BranchParams],
        tag: object = None,
    ) -> list[Branch]:
        """One call per branch, its whole context as the prompt: the server serves all but the
        appended ids from its prompt cache."""
        contexts = self._contexts(handles, appended, branches)
        rank = rank_of(tag)
        async with self._slot(len(branches)):
            calls = [self._complete(c, b, 1, rank) for c, b in zip(contexts, branches, strict=True)]
            done = await gather_or_cancel(calls)
        return [one[0] for one in done]
