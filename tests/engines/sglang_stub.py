"""A stand-in SGLang runtime: real HTTP, SGLang's wire format, deterministic text (not a model).

No GPU here, so no SGLang. This app answers the endpoints the SGLang backend uses with the
shapes SGLang's source produces (python/sglang/srt/, read for this stub):
- POST /generate, entrypoints/http_server.py generate_request: the body is a GenerateReqInput
  (managers/io_struct.py); a single prompt answers one dict, a batch (input_ids a list of lists)
  a list. Each: {"text", "output_ids", "meta_info"} (managers/tokenizer_manager.py
  _handle_batch_output) with meta_info {"id", "finish_reason", "prompt_tokens", "weight_version",
  "num_retractions", "reasoning_tokens", "completion_tokens", "cached_tokens", "e2e_latency"}
  and, with return_logprob, "input_token_logprobs", "output_token_logprobs" ([logprob, token id,
  null] triples, detokenize_logprob_tokens) and "output_token_logprobs_length".
- finish_reason (managers/schedule_batch.py to_json): {"type": "stop", "matched": <token id>} at
  EOS, {"type": "stop", "matched": "<stop string>"} at a stop string (the text ends before it),
  {"type": "length", "length": n} at max_new_tokens.
- errors: an unknown field is a validation error, answered HTTP 400 (http_server.py overrides
  FastAPI's 422); a ValueError is HTTP 400 {"error": {"message"}} (_create_error_response).
- cached_tokens: the longest prefix shared with earlier sequences (prompt + output, as the radix
  cache keeps finished requests), capped by schedule_batch.py _compute_max_prefix_len: at most
  len - 1, and at most logprob_start_len when logprobs are asked. A batch is scheduled together:
  its prompts see the cache as it was before the batch (why the backend warms the prefix first).
- GET /health -> 200 (503 while unhealthy); GET /get_model_info -> {"model_path", ...}.
- GET /server_info and its deprecated name /get_server_info (http_server.py server_info):
  dataclasses.asdict(ServerArgs) flat (a few of its fields here), the scheduler's info,
  "internal_states" and "version". The router proxies only /get_server_info: server_info_paths
  picks which names answer.
- skip_tokenizer_init (--skip-tokenizer-init): each /generate result is {"output_ids",
  "meta_info"}, no "text" (tokenizer_manager.py _handle_batch_output, BatchTokenIDOutput).
It records every /generate body so tests can assert what the backend sent.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from egrm.engines.remote.tokenizer import LocalTokenizer
from egrm.pipeline.templates import JUDGE

# The GenerateReqInput and SamplingParams fields this stub understands; anything else is refused,
# as the real runtime refuses fields it does not know.
_REQUEST_FIELDS = {"text", "input_ids", "sampling_params", "return_logprob", "logprob_start_len", "rid", "stream"}
_SAMPLING_FIELDS = {
    *("temperature", "top_p", "max_new_tokens", "stop", "regex", "sampling_seed", "ignore_eos"),
    *("top_k", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty"),
}

# What a branch continued with the reasoning cue writes: working that ends on its result.
REASONING = "12+30=10+30+2+0=40+2=42."

# (index in the batch, sampling params) -> the answer text of a branch that is not reasoning: a
# regex-constrained one (a verdict), or a free short answer (the solve-first judge's own answer).
AnswerScript = Callable[[int, dict[str, Any]], str]


def unanimous(answer: str = "42", verdict: str = " Yes") -> AnswerScript:
    """Every branch gives `answer`; one constrained to the verdicts (a regex) gives `verdict`."""
    return lambda i, params: verdict if _constrained(params) else answer


def _constrained(params: dict[str, Any]) -> bool:
    """A regex-constrained request: SGLang's regex, vLLM's structured outputs or guided_regex."""
    return any(params.get(k) for k in ("regex", "structured_outputs", "guided_regex"))


def reasoning_follows(tok: LocalTokenizer, prompt: list[int]) -> bool:
    """Whether the prompt ends with the reasoning cue: the long path asks this branch to reason."""
    return tok.decode(prompt).endswith(JUDGE.reasoning_cue)


def split(*answers: str) -> AnswerScript:
    """Branch i answers answers[i % len]: a disagreement that sends an item to the long path."""
    return lambda i, params: answers[i % len(answers)]


class UnknownFieldError(ValueError):
    pass


@dataclass
class StubRuntime:
    tok: LocalTokenizer
    model_path: str = "stub/SmolLM2-135M-Instruct"
    answers: AnswerScript = field(default_factory=unanimous)
    healthy: bool = True
    skip_tokenizer_init: bool = False
    server_info_paths: tuple[str, ...] = ("/server_info", "/get_server_info")
    requests: list[dict[str, Any]] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)  # the Authorization header of each
    # Each queued (status, body, content type) answers one /generate instead of the model.
    failures: list[tuple[int, bytes, str]] = field(default_factory=list)
    _cache: list[tuple[int, ...]] = field(default_factory=list)

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        async def health() -> Response:
            return Response(status_code=200 if self.healthy else 503)

        @app.get("/get_model_info")
        async def model_info() -> dict[str, Any]:
            return {
                "model_path": self.model_path,
                "tokenizer_path": self.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
            }

        async def server_info() -> dict[str, Any]:
            return {
                "model_path": self.model_path,
                "tokenizer_path": self.model_path,
                "skip_tokenizer_init": self.skip_tokenizer_init,
                "enable_deterministic_inference": False,
                "host": "127.0.0.1",
                "port": 30000,
                "max_total_num_tokens": 1 << 16,
                "internal_states": [{}],
                "version": "stub",
            }

        for path in self.server_info_paths:
            app.add_api_route(path, server_info, methods=["GET"])

        @app.post("/generate")
        async def generate(request: Request) -> Response:
            body = await request.json()
            self.requests.append(body)
            self.authorizations.append(request.headers.get("authorization"))
            if self.failures:
                status, content, media = self.failures.pop(0)
                return Response(content, status_code=status, media_type=media)
            try:
                return JSONResponse(self._generate(body))
            except UnknownFieldError as exc:  # http_server.py validation_exception_handler's shape
                error = {"object": "error", "message": str(exc), "type": "Bad Request", "param": None, "code": 400}
                return JSONResponse(error, status_code=400)
            except ValueError as exc:
                return JSONResponse({"error": {"message": str(exc)}}, status_code=400)

        return app

    def _generate(self, body: dict[str, Any]) -> Any:
        unknown = set(body) - _REQUEST_FIELDS
        if unknown:
            raise UnknownFieldError(f"unknown fields {sorted(unknown)}")
        ids = body["input_ids"]
        single = isinstance(ids[0], int)
        prompts = [ids] if single else ids
        params = body.get("sampling_params") or {}
        params = [params] * len(prompts) if isinstance(params, dict) else params
        starts = body.get("logprob_start_len", -1)
        starts = [starts] * len(prompts) if not isinstance(starts, list) else starts
        logprob = bool(body.get("return_logprob"))
        if len(params) != len(prompts) or len(starts) != len(prompts):
            raise ValueError("sampling_params and logprob_start_len must have one entry per prompt")
        snapshot = list(self._cache)  # one batch is scheduled together
        outs = [
            self._one(i, p, sp, start, logprob, snapshot)
            for i, (p, sp, start) in enumerate(zip(prompts, params, starts, strict=True))
        ]
        return outs[0] if single else outs

    def _one(self, i: int, prompt: list[int], sp: dict[str, Any], start: int, logprob: bool, cache: list) -> dict:
        unknown = set(sp) - _SAMPLING_FIELDS
        if unknown:
            raise UnknownFieldError(f"unknown sampling params {sorted(unknown)}")
        context = self.tok.context_length or 1 << 30
        if len(prompt) + sp.get("max_new_tokens", 128) > context:
            raise ValueError(f"The input ({len(prompt)} tokens) is longer than the model's context length")
        text, out_ids, reason = self._decode(i, sp, reasoning_follows(self.tok, prompt))
        cap = len(prompt) - 1
        if logprob and start >= 0:
            cap = min(cap, start)
        cached = min(max((_common(prompt, seen) for seen in cache), default=0), max(cap, 0))
        self._cache.append((*prompt, *out_ids))
        meta: dict[str, Any] = {
            "id": uuid.uuid4().hex,
            "finish_reason": reason,
            "prompt_tokens": len(prompt),
            "weight_version": "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": len(out_ids),
            "cached_tokens": cached,
            "e2e_latency": 0.01,
        }
        if logprob:
            meta["input_token_logprobs"] = [[None, prompt[start], None]] if 0 <= start < len(prompt) else []
            meta["output_token_logprobs"] = [[-0.25, t, None] for t in out_ids]
            meta["output_token_logprobs_length"] = len(out_ids)
        if self.skip_tokenizer_init:
            return {"output_ids": out_ids, "meta_info": meta}
        return {"text": text, "output_ids": out_ids, "meta_info": meta}

    def _decode(self, i: int, sp: dict[str, Any], reasoning: bool) -> tuple[str, list[int], dict[str, Any]]:
        limit = sp.get("max_new_tokens", 128)
        eos = min(self.tok.eos_ids)
        if limit == 0:
            return "", [], {"type": "length", "length": 0}
        if not reasoning:
            answer = self.answers(i, sp)
            if sp.get("regex") is not None and not re.fullmatch(sp["regex"], answer):
                raise AssertionError(f"test script answer {answer!r} does not match {sp['regex']!r}")
            ids = self.tok.encode(answer)
            if len(ids) >= limit:  # the grammar is done; EOS would come next
                return self.tok.decode(ids[:limit]), ids[:limit], {"type": "length", "length": limit}
            return answer, [*ids, eos], {"type": "stop", "matched": eos}
        ids = self.tok.encode(REASONING)
        for stop in sp.get("stop") or []:
            if stop in REASONING:  # the runtime trims the text at the stop string, keeps its tokens
                end = REASONING.index(stop)
                kept = self.tok.encode(REASONING[: end + len(stop)])
                if len(kept) <= limit:
                    return REASONING[:end], kept, {"type": "stop", "matched": stop}
        if len(ids) >= limit:
            return self.tok.decode(ids[:limit]), ids[:limit], {"type": "length", "length": limit}
        return REASONING, [*ids, eos], {"type": "stop", "matched": eos}


def _common(a: list[int], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


if __name__ == "__main__":  # serve the stand-in alone, to dry-run the live tests' code without a GPU
    import argparse

    import uvicorn

    from egrm.config import Settings
    from egrm.engines.embedded.fetch import model_dir
    from egrm.engines.remote.tokenizer import load_tokenizer

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=30000)
    port = parser.parse_args().port
    uvicorn.run(StubRuntime(load_tokenizer(model_dir(Settings().cache_dir))).app(), host="127.0.0.1", port=port)
