"""The SGLang backend: the M branches of a prompt as ONE batched POST /generate to a runtime.

SGLang shares the prompt's KV through its radix cache. A batch of M copies of a prompt that is
not cached yet would be prefilled M times (the copies are scheduled together), so the prompt is
first sent alone with max_new_tokens 0: what SGLang's own frontend does before a fork
(python/sglang/lang/backend/runtime_endpoint.py, cache_prefix). Then the M branches, each with
its own sampling parameters, hit the cached prompt; `meta_info.cached_tokens` shows it.

The wire format, from SGLang's source (python/sglang/srt/):
- request, managers/io_struct.py GenerateReqInput: `input_ids` (a list of lists for a batch),
  `sampling_params` (a dict, or a list of one dict per prompt: sampling/sampling_params.py
  SamplingParams: temperature, top_p, max_new_tokens, stop, regex, ignore_eos, sampling_seed),
  `return_logprob`, `logprob_start_len` (where prompt logprobs start; it caps the cache hit).
- response, entrypoints/http_server.py generate_request -> managers/tokenizer_manager.py
  _handle_batch_output: per prompt {"text", "output_ids", "meta_info"}, a list for a batch;
  meta_info has id, prompt_tokens, completion_tokens, cached_tokens, finish_reason (a dict from
  managers/schedule_batch.py FINISH_*.to_json(): {"type": "stop", "matched": str | token id},
  {"type": "length", "length": n}, {"type": "abort", "message": ...}), and with return_logprob
  output_token_logprobs: [[logprob, token_id, text | null], ...] (detokenize_logprob_tokens).
- errors, http_server.py _create_error_response: HTTP 400 {"error": {"message": ...}}.
- health: GET /health (200 when the runtime answers); model: GET /model_info or the older
  GET /get_model_info, {"model_path": ...}.
- server args: GET /server_info (entrypoints/http_server.py server_info: dataclasses.asdict of
  server_args.py ServerArgs, so `skip_tokenizer_init` is a top-level key); /get_server_info is its
  deprecated name, and the only one the router proxies (sgl-model-gateway src/server.rs).
  With --skip-tokenizer-init an answer has no "text" (tokenizer_manager.py _handle_batch_output,
  the BatchTokenIDOutput branch), so such a runtime is refused at the readiness check.

Continuing a branch (the long path) sends the branch's whole context (prompt + its tokens +
the new text) as token ids: the runtime finds all but the new text in its radix cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from egrm.engines.base import (
    BackendRejectedError,
    Branch,
    BranchParams,
    EngineUnavailableError,
    FinishReason,
)
from egrm.engines.remote.answers import answers_regex
from egrm.engines.remote.base import RemoteEngine
from egrm.engines.remote.tokenizer import LocalTokenizer

_GENERATE = "/generate"
_MODEL_INFO = ("/model_info", "/get_model_info")  # /get_model_info is the older name
_SERVER_INFO = ("/server_info", "/get_server_info")  # the router serves only the older name


@dataclass(frozen=True, slots=True)
class _Output:
    text: str
    ids: list[int]
    finish: FinishReason
    matched_token: int | None  # the stop token id, when a token ended the branch
    prompt_tokens: int
    cached_tokens: int
    logprobs: list[float]


# The method samples with a temperature and top_p and nothing else: every other filter and penalty
# is sent at its neutral value, so neither --preferred-sampling-params nor a model's
# generation_config.json (applied on SGLang's chat route with --sampling-defaults model, and named
# by its docs for /generate too) can change the judge's samples. sampling_params.py: top_k -1 is
# "all" (0 is refused), min_p 0 and the penalties 0 / 1.0 are off.
NEUTRAL = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0}


def sampling_params(p: BranchParams) -> dict[str, Any]:
    """One branch's SamplingParams dict; temperature 0 is greedy in SGLang too."""
    params: dict[str, Any] = {
        "temperature": p.temperature,
        "top_p": p.top_p,
        **NEUTRAL,
        "max_new_tokens": p.max_new_tokens,
    }
    if p.stop:
        params["stop"] = list(p.stop)
    if p.allowed is not None:
        params["regex"] = answers_regex(p.allowed)
    if p.seed is not None:
        params["sampling_seed"] = p.seed
    if p.ignore_eos:
        params["ignore_eos"] = True
    return params


def _logprobs_of_output(prompts: Sequence[Sequence[int]]) -> dict[str, Any]:
    """Ask for the output tokens' logprobs without losing the cached prompt.

    The runtime reuses a cached prefix only up to logprob_start_len (managers/schedule_batch.py
    _compute_max_prefix_len; older releases cap it even at -1), so start at the last prompt
    token: the whole prompt but one stays a cache hit, as it would without logprobs.
    """
    return {"return_logprob": True, "logprob_start_len": [len(p) - 1 for p in prompts]}


class SGLangEngine(RemoteEngine):
    KIND = "SGLang runtime"

    def __init__(
        self,
        tokenizer: LocalTokenizer,
        url: str,
        api_key: str = "",
        timeout_s: float = 120.0,
        max_queue: int = 1024,
    ):
        super().__init__(tokenizer, url, api_key, timeout_s, max_queue)
        self._runtime_model: str | None = None
        self._asked = False  # the runtime's server args were asked for (once)

    @property
    def model_name(self) -> str:
        return self._runtime_model or self._tok.name

    async def sample(
        self, prefix: str | Sequence[int], branches: Sequence[BranchParams], tag: object = None
    ) -> list[Branch]:
        ids = self._prompt_ids(prefix, branches)
        async with self._slot(len(branches)):
            warm = (await self._generate({"input_ids": ids, "sampling_params": {"max_new_tokens": 0}}))[0]
            outs = await self._generate(
                {
                    "input_ids": [ids] * len(branches),
                    "sampling_params": [sampling_params(b) for b in branches],
                    **_logprobs_of_output([ids] * len(branches)),
                }
            )
        self._expect(len(outs), len(branches))
        done = [self._branch(ids, o) for o in outs]
        # The warm-up computed the prompt once for all branches: the first branch pays for it, as
        # in the embedded engine, so usage counts what the runtime actually computed.
        warm_computed = warm.prompt_tokens - warm.cached_tokens
        done[0].cached_prompt_tokens = max(0, done[0].cached_prompt_tokens - warm_computed)
        return done

    async def continue_branches(
        self,
        handles: Sequence[Any],
        appended: str | Sequence[int],
        branches: Sequence[BranchParams],
        tag: object = None,
    ) -> list[Branch]:
        contexts = self._contexts(handles, appended, branches)
        async with self._slot(len(branches)):
            outs = await self._generate(
                {
                    "input_ids": contexts,
                    "sampling_params": [sampling_params(b) for b in branches],
                    **_logprobs_of_output(contexts),
                }
            )
        self._expect(len(outs), len(branches))
        return [self._branch(c, o) for c, o in zip(contexts, outs, strict=True)]

    def _branch(self, context: list[int], out: _Output) -> Branch:
        own = out.ids[:-1] if out.matched_token is not None and out.ids[-1:] == [out.matched_token] else out.ids
        return Branch(
            text=out.text,
            token_ids=out.ids,
            finish_reason=out.finish,
            prompt_tokens=out.prompt_tokens,
            cached_prompt_tokens=out.cached_tokens,
            logprobs=out.logprobs,
            handle=self._handle(context, own),
        )

    async def _generate(self, body: dict[str, Any]) -> list[_Output]:
        answer = await self._client.post(_GENERATE, body)
        self._stats.batches += 1
        items = answer if isinstance(answer, list) else [answer]
        outs = [self._parse(item) for item in items]
        self._stats.prefix_cache_hit_tokens += sum(o.cached_tokens for o in outs)
        return outs

    def _parse(self, item: Any) -> _Output:
        try:
            reason = item["meta_info"]["finish_reason"]
        except (KeyError, TypeError) as exc:
            raise self._client.malformed(_GENERATE, f"no meta_info.finish_reason: {exc!r}") from exc
        if isinstance(reason, dict) and reason.get("type") == "abort":
            raise BackendRejectedError(f"SGLang runtime at {self.url} aborted a branch: {reason.get('message')}")
        try:
            meta = item["meta_info"]
            text = str(item["text"])
            logprobs = [float(t[0]) for t in meta.get("output_token_logprobs") or [] if t[0] is not None]
            ids = item.get("output_ids")
            if ids is None:  # runtimes before output_ids was returned: the ids ride with the logprobs
                ids = [int(t[1]) for t in meta.get("output_token_logprobs") or []] or self.encode(text)
            kind = reason.get("type") if isinstance(reason, dict) else reason
            matched = reason.get("matched") if isinstance(reason, dict) else None
            finish = FinishReason.LENGTH if kind == "length" else FinishReason.STOP
            ids = [int(i) for i in ids]
            if finish is FinishReason.STOP:
                ids, logprobs = self._tok.own_tokens(ids, logprobs)
            return _Output(
                text=text,
                ids=ids,
                finish=finish,
                matched_token=matched if isinstance(matched, int) else None,
                prompt_tokens=int(meta["prompt_tokens"]),
                cached_tokens=int(meta.get("cached_tokens") or 0),
                logprobs=logprobs,
            )
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise self._client.malformed(_GENERATE, f"{type(exc).__name__}: {exc}") from exc

    def _expect(self, got: int, want: int) -> None:
        if got != want:
            raise self._client.malformed(_GENERATE, f"{got} results for {want} prompts")

    async def ready(self) -> bool:
        if not await self._client.probe("/health", self._ready_timeout_s):
            return False
        if self._runtime_model is None:
            info = await self._first_answer(_MODEL_INFO)
            self._runtime_model = str(info["model_path"]) if info and info.get("model_path") else None
        if not self._asked:
            await self._check_server_args()
        return self._refusal is None

    async def _check_server_args(self) -> None:
        """Refuse a runtime that answers without text. Asked once; a runtime that cannot say is taken
        as it is (a check cut short by the readiness deadline is asked again)."""
        args = await self._first_answer(_SERVER_INFO)
        self._asked = True
        if args and args.get("skip_tokenizer_init"):
            self._refuse(
                f"SGLang runtime at {self.url} was started with --skip-tokenizer-init: it answers token ids "
                "without their text, which egrm reads for every answer; restart it without that flag"
            )

    async def _first_answer(self, paths: Sequence[str]) -> dict[str, Any] | None:
        """The first JSON object one of the paths answers (runtimes and the router name some differently)."""
        for path in paths:
            try:
                answer = await self._client.get(path, self._ready_timeout_s)
            except (EngineUnavailableError, BackendRejectedError):
                continue
            if isinstance(answer, dict):
                return answer
        return None
