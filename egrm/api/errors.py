"""One error shape for every 4xx/5xx: {"error": {"type", "message", "param"}}.

The OpenAI-compatible routes answer as OpenAI does (openai-python reads `code`, `param` and `type`
into its exceptions): an invalid request is a 400 with a `code`, not a 422.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from egrm.engines.base import EngineBusyError, EngineUnavailableError, RequestTooLargeError
from egrm.pipeline.service import PromptTooLongError
from egrm.pipeline.sharing import OverloadedError
from egrm.protocol import ErrorDetail, ErrorResponse

log = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        type: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.headers = status, message, param, type, headers


class ClientGoneError(Exception):
    """The client disconnected; nobody reads the answer."""


def error_response(
    status: int,
    type: str,
    message: str,
    param: str | None = None,
    headers: dict | None = None,
    code: str | None = None,
) -> JSONResponse:
    body = ErrorResponse(error=ErrorDetail(type=type, message=message, param=param, code=code))
    return JSONResponse(body.model_dump(exclude={"error": {"code"}} if code is None else None), status, headers)


_OPENAI_ROUTES = ("/v1/chat/", "/v1/models")


def _invalid(request: Request, message: str, param: str | None, code: str) -> JSONResponse:
    """422 on egrm's routes; OpenAI's 400 with a code on its routes."""
    if request.url.path.startswith(_OPENAI_ROUTES):
        return error_response(400, "invalid_request_error", message, param, code=code)
    return error_response(422, "invalid_request_error", message, param)


# pydantic's error types, as OpenAI's codes
_CODES = {"extra_forbidden": "unknown_parameter", "missing": "missing_required_parameter"}


def param_path(loc: Sequence[Any]) -> str:
    """('body', 'items', 0, 'prompt') -> 'items[0].prompt'."""
    out = ""
    for part in loc[1:] if loc and loc[0] in ("body", "query", "path") else loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def _msg(text: str) -> str:
    return text.removeprefix("Value error, ")


def _validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    param = param_path(first["loc"])
    message = "; ".join(f"{param_path(e['loc'])}: {_msg(e['msg'])}" for e in errors[:5]) or "invalid request"
    return _invalid(request, message, param, _CODES.get(str(first.get("type", "")), "invalid_value"))


def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    if exc.status == 422:
        return _invalid(request, exc.message, exc.param, "invalid_value")
    return error_response(exc.status, exc.type, exc.message, exc.param, headers=exc.headers)


def _http(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return error_response(exc.status_code, kind, str(exc.detail), headers=getattr(exc, "headers", None))


def _client_gone(_: Request, exc: Exception) -> JSONResponse:
    # Nobody reads this; 499 (nginx's "client closed request") keeps access logs honest.
    return error_response(499, "client_closed", "the client closed the connection; its work was cancelled")


def _prompt_too_long(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, PromptTooLongError)
    message = (
        f"items[{exc.index}] renders to a {exc.tokens}-token judge prompt; "
        f"the limit is EGRM_MAX_PROMPT_TOKENS={exc.limit}"
    )
    return error_response(413, "invalid_request_error", message, f"items[{exc.index}]")


def _too_large(_: Request, exc: Exception) -> JSONResponse:
    # Never retried: no wait makes it fit (the message names the limit).
    return error_response(413, "invalid_request_error", str(exc), "items")


def _busy(_: Request, exc: Exception) -> JSONResponse:
    return error_response(429, "rate_limit_error", str(exc), headers={"Retry-After": "1"})


def _overloaded(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OverloadedError)
    return error_response(429, "rate_limit_error", str(exc), headers={"Retry-After": str(int(exc.retry_after_s))})


def _unavailable(_: Request, exc: Exception) -> JSONResponse:
    # The message names the backend's URL (never a key); the client may retry once it is back.
    return error_response(503, "engine_unavailable", str(exc), headers={"Retry-After": "5"})


def _unhandled(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return error_response(500, "internal_error", f"internal error: {type(exc).__name__}")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(EngineBusyError, _busy)
    app.add_exception_handler(OverloadedError, _overloaded)
    app.add_exception_handler(RequestTooLargeError, _too_large)
    app.add_exception_handler(EngineUnavailableError, _unavailable)
    app.add_exception_handler(PromptTooLongError, _prompt_too_long)
    app.add_exception_handler(ClientGoneError, _client_gone)
    app.add_exception_handler(Exception, _unhandled)
