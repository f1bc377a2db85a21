"""The OpenAI-compatible backend: branches as POST {url}/completions calls (vLLM, llama.cpp, ...).

The completions API samples one parameter set per call, so M branches with M temperatures are M
concurrent calls (the server batches them; with prefix caching they share the prompt's KV); when
every branch asks for the same thing, ONE call with `n` = M. Prompts go as token ids (the
OpenAI API and vLLM accept a list of ints): no second tokenization, exact prompt counts.

The wire format: OpenAI API reference, "Completions" (POST /v1/completions: prompt, max_tokens,
temperature, top_p, n, stop, seed, logprobs; response choices[i] = {index, text, logprobs:
{tokens, token_logprobs, top_logprobs, text_offset}, finish_reason: "stop" | "length"}, usage =
{prompt_tokens, completion_tokens, total_tokens}), and vLLM's extensions in
vllm/entrypoints/openai/protocol.py (CompletionRequest: structured_outputs {"regex"}, older
guided_regex, return_tokens_as_token_ids, ignore_eos; CompletionResponseChoice.token_ids; UsageInfo.
prompt_tokens_details.cached_tokens). Errors: {"error": {"message", "type", "param", "code"}}.

Dialects (EGRM_OPENAI_DIALECT): "openai" sends standard fields only: answers are free text that
the pipeline's templates read with their patterns, and branch token ids are our tokenizer's
reading of the text; "vllm" adds structured_outputs.regex (constrained answers),
return_tokens_as_token_ids (the sampled ids, in the log-probs), ignore_eos, and `priority` on spare
and background work (vLLM's request priority, which it heeds when started with
--scheduling-policy priority); "vllm-legacy" sends guided_regex (vLLM before structured_outputs)
instead of structured_outputs, and no priority.

vLLM 0.12 removed guided_regex (vllm-project/vllm#29326) and accepts unknown fields, logging them at
debug level only (vllm/entrypoints/serve/engine/protocol.py OpenAIBaseModel, extra="allow"): the
answers would come back unconstrained. So with "vllm-legacy" the readiness check asks GET /version,
served at the server root, not under /v1 (vllm/entrypoints/serve/instrumentator/basic.py,
{"version": "0.12.0"}), and refuses a vLLM >= 0.12.

vLLM reports usage.prompt_tokens_details.cached_tokens only when started with
--enable-prompt-tokens-details (vllm/entrypoints/openai/cli_args.py FrontendArgs); without it every
prompt token counts as computed.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Any, Literal

from egrm.aio import gather_or_cancel
from egrm.engines.base import (
    LIVE,
    BackendRejectedError,
    Branch,
    BranchParams,
    EngineBusyError,
    EngineUnavailableError,
    FinishReason,
    rank_of,
)
from egrm.engines.remote.answers import answers_regex
from egrm.engines.remote.base import TOKENIZER_PROBE, CompletionsEngine
from egrm.engines.remote.tokenizer import LocalTokenizer

Dialect = Literal["openai", "vllm", "vllm-legacy"]
_COMPLETIONS = "/completions"
_NO_GUIDED_REGEX = (0, 12)  # the first vLLM release without guided_regex
_TOKEN_ID = "token_id:"  # how vLLM names a token by its id (return_tokens_as_token_ids)


class OpenAIEngine(CompletionsEngine):
    KIND = "OpenAI-compatible server"

    def __init__(
        self,
        tokenizer: LocalTokenizer,
        url: str,
        api_key: str = "",
        model: str = "",
        dialect: Dialect = "openai",
        timeout_s: float = 120.0,
        max_queue: int = 1024,
    ):
        """url: the API base, as the OpenAI SDK takes it (e.g. http://127.0.0.1:8000/v1)."""
        super().__init__(tokenizer, url, api_key, timeout_s, max_queue)
        self._model = model or None  # None: the first model the server lists
        self._listing = asyncio.Lock()  # calls that find no model yet ask the server once, not each
        self.dialect = dialect
        self._asked = False  # the server's version was asked for (vllm-legacy only, once)

    @property
    def model_name(self) -> str:
        return self._model or self._tok.name

    async def sample(
        self, prefix: str | Sequence[int], branches: Sequence[BranchParams], tag: object = None
    ) -> list[Branch]:
        ids, rank = self._prompt_ids(prefix, branches), rank_of(tag)
        async with self._slot(len(branches)):
            if len(branches) > 1 and all(b == branches[0] for b in branches):
                return await self._complete(ids, branches[0], len(branches), rank)
            done = await gather_or_cancel([self._complete(ids, b, 1, rank) for b in branches])
        return [branch for one in done for branch in one]

    def request_body(self, model: str, ids: list[int], p: BranchParams, n: int, rank: int = LIVE) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "prompt": ids,
            "max_tokens": p.max_new_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "n": n,
            "logprobs": 1,  # the sampled token's log-prob comes with it (and at most one other)
        }
        if p.stop:
            body["stop"] = list(p.stop)
        if p.seed is not None:
            body["seed"] = p.seed
        # The method samples with a temperature and top_p and nothing else. OpenAI's own penalties
        # default to 0 everywhere; vLLM also takes top_k, min_p and repetition_penalty from the
        # model's generation_config.json when a request leaves them out (--generation-config auto,
        # its default: vllm/config/model.py get_diff_sampling_param), so they are sent neutral.
        body |= {"frequency_penalty": 0.0, "presence_penalty": 0.0}
        if self.dialect != "openai":
            body |= {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
            if p.ignore_eos:
                body["ignore_eos"] = True
            if p.allowed is not None:
                regex = answers_regex(p.allowed)
                if self.dialect == "vllm":
                    body["structured_outputs"] = {"regex": regex}
                else:
                    body["guided_regex"] = regex
            # The sampled ids ride in the log-probs ("token_id:N"; vLLM 0.5 on): return_token_ids
            # would bring them too, with the prompt echoed, and cost vLLM 0.32 a fifth of its items/s
            # here (bench_remote).
            body["return_tokens_as_token_ids"] = True
            if rank != LIVE and self.dialect == "vllm":
                # Spare and background work: a vLLM started with --scheduling-policy priority starts
                # it only when no live request waits for a slot (lower first; 0 is the default).
                # Under fcfs vLLM's V1 engine ignores it (0.32 checked); its V0 engine, which some
                # releases before 0.12 ran, refused it: not sent to those (vllm-legacy).
                body["priority"] = rank
        return body

    async def _complete(self, ids: list[int], p: BranchParams, n: int, rank: int = LIVE) -> list[Branch]:
        model = self._model or await self._first_model()
        answer = await self._client.post(_COMPLETIONS, self.request_body(model, ids, p, n, rank))
        self._stats.batches += 1
        try:
            choices = sorted(answer["choices"], key=lambda c: int(c["index"]))
            usage = answer.get("usage") or {}
            prompt = int(usage.get("prompt_tokens") or len(ids))
            cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
            branches = [self._branch(ids, c, prompt, cached if i == 0 else prompt) for i, c in enumerate(choices)]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise self._client.malformed(_COMPLETIONS, f"{type(exc).__name__}: {exc}") from exc
        if len(branches) != n:
            raise self._client.malformed(_COMPLETIONS, f"{len(branches)} choices for n={n}")
        # With n > 1 the server computed the prompt once: the first choice carries it, the
        # others shared it (as the embedded engine counts its branches).
        self._stats.prefix_cache_hit_tokens += cached + prompt * (n - 1)
        return branches

    def _branch(self, context: list[int], choice: dict[str, Any], prompt: int, cached: int) -> Branch:
        text = str(choice["text"])
        logprobs = choice.get("logprobs") or {}
        values = [float(v) for v in logprobs.get("token_logprobs") or [] if v is not None]
        ids = _sampled_ids(choice, logprobs.get("tokens") or [])
        if ids is None:  # a plain OpenAI server names no ids: our tokenizer reads the text
            ids = self.encode(text)
        finish = FinishReason.LENGTH if choice.get("finish_reason") == "length" else FinishReason.STOP
        if finish is FinishReason.STOP:
            ids, values = self._tok.own_tokens(ids, values)
        return Branch(
            text=text,
            token_ids=ids,
            finish_reason=finish,
            prompt_tokens=prompt,
            cached_prompt_tokens=cached,
            logprobs=values,
            handle=self._handle(context, ids),
        )

    async def _first_model(self) -> str:
        async with self._listing:
            if self._model is None:
                self._model = self._listed(await self._client.get("/models"))
        return self._model

    def _listed(self, listing: Any) -> str:
        try:
            return str(listing["data"][0]["id"])
        except (KeyError, TypeError, IndexError) as exc:
            raise self._client.malformed("/models", "no model listed; set EGRM_OPENAI_MODEL") from exc

    async def ready(self) -> bool:
        """The server lists its models in time (the first is the one to ask, unless one is set)."""
        try:
            listing = await self._client.get("/models", self._ready_timeout_s)
            if self._model is None:
                self._model = self._listed(listing)
        except (EngineUnavailableError, EngineBusyError, BackendRejectedError):
            return False
        if self.dialect != "openai":  # vLLM's /tokenize, at the server root beside /version
            body = {"model": self.model_name, "prompt": TOKENIZER_PROBE, "add_special_tokens": False}
            if not await self._compare_tokenizers(f"{self.url.removesuffix('/v1')}/tokenize", body):
                return False
        if self.dialect == "vllm-legacy" and not self._asked:
            await self._check_guided_regex()
        return self._refusal is None

    async def _check_guided_regex(self) -> None:
        """Refuse a vLLM that ignores guided_regex. Asked once; a server without GET /version is
        taken as it is (a check cut short by the readiness deadline is asked again)."""
        try:
            answer = await self._client.get(f"{self.url.removesuffix('/v1')}/version", self._ready_timeout_s)
        except (EngineUnavailableError, BackendRejectedError):
            answer = None
        self._asked = True
        version = str(answer.get("version") or "") if isinstance(answer, dict) else ""
        if _release(version) >= _NO_GUIDED_REGEX:
            self._refuse(
                f"vLLM {version} at {self.url} ignores guided_regex (removed in vLLM 0.12), so the answers would "
                "not be constrained: set EGRM_OPENAI_DIALECT=vllm (structured_outputs) instead of vllm-legacy"
            )


def _sampled_ids(choice: dict[str, Any], tokens: Sequence[Any]) -> list[int] | None:
    """The ids vLLM sampled: named in the log-probs' tokens ("token_id:N", return_tokens_as_token_ids)
    or listed in token_ids (return_token_ids); None from a server that gives neither."""
    if choice.get("token_ids") is not None:
        return [int(i) for i in choice["token_ids"]]
    if tokens and all(isinstance(t, str) and t.startswith(_TOKEN_ID) for t in tokens):
        return [int(t[len(_TOKEN_ID) :]) for t in tokens]
    return None


def _release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as "0.12.0" or "0.11.2+cu128"; (0, 0) if unreadable."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else (0, 0)
