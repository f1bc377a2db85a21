"""The Engine contract: sample M branches from one shared prefix, and continue them later."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, runtime_checkable


class FinishReason(str, Enum):
    STOP = "stop"  # EOS, a stop string, or a complete constrained answer
    LENGTH = "length"  # max_new_tokens reached


@dataclass(slots=True)
class BranchParams:
    """Sampling parameters of one branch; heterogeneous values within one call are the point."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 16
    stop: tuple[str, ...] = ()
    # Constrained choice: the branch may only produce one of these strings, then it stops.
    allowed: tuple[str, ...] | None = None
    seed: int | None = None
    ignore_eos: bool = False  # decode exactly max_new_tokens (benchmarks), as SGLang's flag

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.allowed is not None and not [a for a in self.allowed if a.strip()]:
            raise ValueError("allowed must hold at least one non-empty answer")
        self.stop = tuple(self.stop)
        if self.allowed is not None:
            self.allowed = tuple(self.allowed)


@dataclass(slots=True)
class Branch:
    """One sampled branch: its text, tokens, accounting, and a handle to continue it."""

    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    prompt_tokens: int  # context the branch was conditioned on
    cached_prompt_tokens: int  # of those, how many were served from cache (not recomputed)
    # Model log-prob of each new token at T=1 (within the allowed answers when constrained).
    logprobs: list[float] = field(default_factory=list)
    handle: Any = None  # engine-specific; pass to Engine.continue_branches

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def mean_logprob(self) -> float:
        return sum(self.logprobs) / len(self.logprobs) if self.logprobs else 0.0


@dataclass(frozen=True, eq=False, slots=True)
class WorkTag:
    """The tag of an engine call whose work may outlive its request (a question's work, shared and
    kept for a retry). `request` is the client request the engine shares its steps fairly under;
    `waited()` says whether anybody still waits for the work. Work nobody waits for (a deadline
    passed and its grace runs) is background work: it runs only with what live work leaves of a
    step, and gives up its KV first."""

    request: object
    waited: Callable[[], bool]


@dataclass(frozen=True, eq=False, slots=True)
class SpareTag:
    """The tag of work that may turn out not to be needed: the long path's spare candidates,
    reasoned while the first one is read and scored. `tag` is the call's own tag; until `needed()`
    says the caller waits for the work, an engine that schedules runs it only where a step has rows
    to spare (beside little live work an extra row costs a small part of the pass over the
    weights), and gives up its KV before live work does. Then it is live work like any other.
    vLLM gets the rank as the request's priority (see rank_of); llama.cpp and SGLang run it as live
    work."""

    tag: object
    needed: Callable[[], bool]


# What a call's work is to the engine, most urgent first: somebody waits for it; it may turn out not
# to be needed (SpareTag); nobody waits for it any more (WorkTag). An engine computes live work
# first; vLLM, started with --scheduling-policy priority, takes the rank as the request's
# priority (lower first) and starts the others only when no live request waits for a slot.
LIVE, SPARE, BACKGROUND = 0, 1, 2


def rank_of(tag: object) -> int:
    """LIVE, SPARE or BACKGROUND: what a call's tag says of its work now."""
    if is_background(tag):
        return BACKGROUND
    return SPARE if is_spare(tag) else LIVE


def request_of(tag: object) -> object:
    """The client request a call's tag names (the engine's unit of fairness)."""
    if isinstance(tag, SpareTag):
        return request_of(tag.tag)
    return tag.request if isinstance(tag, WorkTag) else tag


def is_background(tag: object) -> bool:
    """Whether nobody waits for a call's work any more."""
    if isinstance(tag, SpareTag):
        return is_background(tag.tag)
    return isinstance(tag, WorkTag) and not tag.waited()


def is_spare(tag: object) -> bool:
    """Whether a call's work may still turn out not to be needed (SpareTag)."""
    return isinstance(tag, SpareTag) and not tag.needed()


@dataclass(slots=True)
class EngineStats:
    """Counters an engine fills as it works; metrics.py turns them into Prometheus series."""

    batches: int = 0  # engine steps (one forward each) or backend calls
    batched_requests: int = 0  # sample and continue jobs taken
    batched_branches: int = 0  # branches in those jobs
    decode_steps: int = 0  # steps that decoded
    prefix_cache_hit_tokens: int = 0  # prompt tokens served from the prefix cache, not computed
    queue_depth: int = 0  # jobs waiting for the model thread (a reading, not a counter)
    kv_bytes: int = 0  # KV cache in use by branches, running or held (a reading; embedded engine only)
    kv_capacity_bytes: int = 0  # the KV pool's size (embedded engine only)
    gc_released: int = 0  # branches whose KV the garbage collector freed: their caller never released them
    background_steps: int = 0  # steps that computed work nobody waited for (WorkTag), beside or after live work
    background_tokens: int = 0  # tokens those steps computed for it
    spare_tokens: int = 0  # tokens computed for spare work (SpareTag) while nobody needed it yet


@runtime_checkable
class Engine(Protocol):
    """A backend that forks M branches from one cached prefix and decodes them together."""

    @property
    def model_name(self) -> str: ...

    def encode_chat(self, messages: Sequence[dict[str, str]], after: int | None = None) -> list[int]:
        """The prompt for a conversation, ending where the assistant's answer begins, as token ids.
        The template's markup is markup; the messages' contents are data (a special-token string in
        one is split into plain tokens). after=k: only what follows message k's content."""
        ...

    def encode(self, text: str) -> list[int]:
        """Token ids of text the pipeline wrote itself (a cue), special tokens as written."""
        ...

    def count_tokens(self, text: str) -> int: ...

    async def sample(
        self, prefix: str | Sequence[int], branches: Sequence[BranchParams], tag: object = None
    ) -> list[Branch]:
        """Prefill `prefix` once, then decode one branch per BranchParams in one batch. tag: the
        client request the call serves (None: untagged), or a WorkTag naming it: an engine that
        schedules shares its steps fairly among requests, so a one-item request is not queued
        behind a big one, and runs work nobody waits for only in its idle time."""
        ...

    async def continue_branches(
        self,
        handles: Sequence[Any],
        appended: str | Sequence[int],
        branches: Sequence[BranchParams],
        tag: object = None,
    ) -> list[Branch]:
        """New branches, one per handle: the branch's context, then `appended` (text the pipeline
        wrote, or token ids), decoded further from the branch's own cache. The branches stay as
        they were: a branch may be continued many times."""
        ...

    def release(self, handles: Sequence[Any]) -> None:
        """The caller will not continue these branches: whatever the engine keeps for them (KV)
        may go. Never blocks."""
        ...

    def stats(self) -> EngineStats: ...

    async def ready(self) -> bool: ...

    async def close(self) -> None: ...


def appended_ids(encode: Callable[[str], list[int]], appended: str | Sequence[int]) -> list[int]:
    """What continue_branches appends, as token ids: text the pipeline wrote is encoded (its
    special tokens as written), ids pass as they are; nothing to append is a caller's error."""
    ids = encode(appended) if isinstance(appended, str) else list(appended)
    if not ids:
        raise ValueError("what to append must not be empty")
    return ids


class RequestTooLargeError(Exception):
    """The call can never fit the engine's limits, however long it waits (HTTP 413). Not a
    ValueError: it fails the whole request up front instead of becoming one item's error."""


class ContextLengthError(ValueError):
    """The prompt plus the tokens asked for do not fit the model's context."""


class EngineBusyError(RuntimeError):
    """The engine's queue is full; the caller should retry later (HTTP 429)."""


class EngineUnavailableError(RuntimeError):
    """The engine's backend (a remote runtime) cannot be reached or answered badly (HTTP 503)."""


class BackendRejectedError(ValueError):
    """The backend refused this input (its HTTP 4xx): the item gets an error, the others go on."""
