"""A stand-in OpenAI-compatible completions server: real HTTP, the real response shape, canned text.

Shapes from the OpenAI API reference (Completions: POST /v1/completions -> {"id", "object":
"text_completion", "created", "model", "choices": [{"index", "text", "logprobs": {"tokens",
"token_logprobs", "top_logprobs", "text_offset"}, "finish_reason": "stop" | "length"}], "usage":
{"prompt_tokens", "completion_tokens", "total_tokens"}}; Models: GET /v1/models -> {"object":
"list", "data": [{"id", "object": "model", "created", "owned_by"}]}; errors {"error": {"message",
"type", "param", "code"}}) and vLLM's additions (vllm/entrypoints/openai/protocol.py:
CompletionResponseChoice.stop_reason / token_ids / prompt_token_ids, UsageInfo.
prompt_tokens_details.cached_tokens, CompletionRequest.structured_outputs / guided_regex (before 0.12) /
return_token_ids / return_tokens_as_token_ids (each log-prob token named "token_id:N"); a branch that
ends its turn has the end-of-turn id last, as vLLM 0.32 answered here; vLLM caches whole KV blocks, 16
tokens by default), and vLLM's GET /version at the server root, not under /v1
(vllm/entrypoints/serve/instrumentator/basic.py: {"version"}).
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from egrm.engines.remote.tokenizer import LocalTokenizer
from tests.engines.sglang_stub import REASONING, AnswerScript, reasoning_follows, unanimous

_BLOCK = 16


@dataclass
class StubOpenAI:
    tok: LocalTokenizer
    model: str = "stub-judge"
    api_key: str = ""
    vllm: bool = False  # answer vLLM's extra fields (token_ids, cached-token details) and /version
    version: str = "0.11.2"  # the vLLM release GET /version names
    # POST /tokenize (vLLM's, at the root; with vllm only): "same" reads the prompt with tok, "other"
    # with another vocabulary (every id moved by one), "refuse" answers 400 (a release whose fields
    # differ); "absent": not served (404).
    tokenize: str = "same"
    answers: AnswerScript = field(default_factory=unanimous)
    requests: list[dict[str, Any]] = field(default_factory=list)
    failures: list[tuple[int, bytes, str]] = field(default_factory=list)
    _cache: list[tuple[int, ...]] = field(default_factory=list)
    _answered: int = 0  # answers so far: the script's index, since each call samples one branch

    def app(self) -> FastAPI:
        app = FastAPI()

        def unauthorized(request: Request) -> Response | None:
            if self.api_key and request.headers.get("authorization") != f"Bearer {self.api_key}":
                error = {"message": "Incorrect API key provided.", "type": "invalid_request_error", "param": None}
                return JSONResponse({"error": {**error, "code": "invalid_api_key"}}, status_code=401)
            return None

        @app.get("/version")
        async def version() -> Response:
            if not self.vllm:
                return JSONResponse({"detail": "Not Found"}, status_code=404)
            return JSONResponse({"version": self.version})

        @app.post("/tokenize")
        async def tokenize(request: Request) -> Response:
            body = await request.json()
            if not self.vllm or self.tokenize == "absent":
                return JSONResponse({"detail": "Not Found"}, status_code=404)
            if self.tokenize == "refuse":
                error = {"message": "unknown field", "type": "BadRequestError", "param": None, "code": 400}
                return JSONResponse({"error": error}, status_code=400)
            ids = self.tok.encode(body["prompt"])
            tokens = ids if self.tokenize == "same" else [i + 1 for i in ids]
            return JSONResponse({"count": len(tokens), "max_model_len": 8192, "tokens": tokens, "token_strs": None})

        @app.get("/v1/models")
        async def models(request: Request) -> Response:
            refused = unauthorized(request)
            if refused is not None:
                return refused
            card = {"id": self.model, "object": "model", "created": 0, "owned_by": "stub"}
            return JSONResponse({"object": "list", "data": [card]})

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            refused = unauthorized(request)
            if refused is not None:
                return refused
            body = await request.json()
            self.requests.append(body)
            if self.failures:
                status, content, media = self.failures.pop(0)
                return Response(content, status_code=status, media_type=media)
            return JSONResponse(self._complete(body))

        return app

    def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = body["prompt"]
        ids = self.tok.encode(prompt) if isinstance(prompt, str) else list(prompt)
        shared = max((_common(ids, seen) for seen in self._cache), default=0)
        self._cache.append(tuple(ids))
        choices, completion = [], 0
        for i in range(body.get("n", 1)):
            text, out, finish = self._decode(i, body, reasoning_follows(self.tok, ids))
            if self.vllm and finish == "stop" and not body.get("stop"):
                out = [*out, min(self.tok.eos_ids)]  # vLLM returns the end of turn that stopped it
            completion += len(out)
            choice: dict[str, Any] = {"index": i, "text": text, "finish_reason": finish, "stop_reason": None}
            as_ids = self.vllm and bool(body.get("return_tokens_as_token_ids"))
            choice["logprobs"] = _logprobs(self.tok, out, as_ids) if body.get("logprobs") is not None else None
            if self.vllm and body.get("return_token_ids"):
                choice["token_ids"], choice["prompt_token_ids"] = out, ids
            choices.append(choice)
        usage: dict[str, Any] = {"prompt_tokens": len(ids), "completion_tokens": completion}
        usage["total_tokens"] = len(ids) + completion
        if self.vllm:
            usage["prompt_tokens_details"] = {"cached_tokens": shared // _BLOCK * _BLOCK}
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "choices": choices,
            "usage": usage,
        }

    def _decode(self, i: int, body: dict[str, Any], reasoning: bool) -> tuple[str, list[int], str]:
        limit = body.get("max_tokens", 16)
        regex = (body.get("structured_outputs") or {}).get("regex") or body.get("guided_regex")
        if not reasoning:
            text = self.answers(self._answered, body)
            self._answered += 1
            if regex is not None and not re.fullmatch(regex, text):
                raise AssertionError(f"test script answer {text!r} does not match {regex!r}")
            return text, self.tok.encode(text), "stop"
        for stop in body.get("stop") or []:
            if stop in REASONING:  # the text ends before the stop string
                text = REASONING[: REASONING.index(stop)]
                out = self.tok.encode(text)
                if len(out) <= limit:
                    return text, out, "stop"
        out = self.tok.encode(REASONING)
        if len(out) < limit:  # the end of turn comes next
            return REASONING, out, "stop"
        return self.tok.decode(out[:limit]), out[:limit], "length"


def _logprobs(tok: LocalTokenizer, out: list[int], as_ids: bool) -> dict[str, Any]:
    tokens = [f"token_id:{t}" if as_ids else tok.decode([t]) for t in out]
    offsets = [sum(len(t) for t in tokens[:k]) for k in range(len(tokens))]
    return {
        "tokens": tokens,
        "token_logprobs": [-0.5] * len(out),
        "top_logprobs": [{t: -0.5} for t in tokens],
        "text_offset": offsets,
    }


def _common(a: list[int], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
