"""One HTTP client for a remote backend: JSON in and out, every failure mapped to an engine error.

- cannot connect, timeout, HTTP 5xx/401/403/404, a body that is not the JSON we expect
  -> EngineUnavailableError (the API answers 503 and /readyz turns false)
- HTTP 429 -> EngineBusyError (the API answers 429 with Retry-After)
- HTTP 400/413/422 -> BackendRejectedError, a ValueError: that item gets an error, the batch goes on
Messages name the backend by its URL without credentials; the API key never appears in one.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from egrm.engines.base import BackendRejectedError, EngineBusyError, EngineUnavailableError

_REJECTED = {400, 413, 422}


def public_url(url: str) -> str:
    """The URL without user:password@ (a credential may ride in it)."""
    parsed = httpx.URL(url)
    return str(parsed.copy_with(username=None, password=None)) if parsed.userinfo else url


class BackendClient:
    def __init__(self, kind: str, base_url: str, api_key: str = "", timeout_s: float = 120.0):
        """kind names the backend in messages ("SGLang runtime"); timeout_s bounds one call."""
        self.kind = kind
        self.url = public_url(base_url.rstrip("/"))
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # Connecting should be quick; generating may take as long as the request deadline allows.
        timeout = httpx.Timeout(timeout_s, connect=min(5.0, timeout_s))
        self._http = httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout)

    async def post(self, path: str, body: dict[str, Any]) -> Any:
        response = await self._send("POST", path, body)
        return self._json(path, response)

    async def get(self, path: str, timeout_s: float | None = None) -> Any:
        response = await self._send("GET", path, None, timeout_s)
        return self._json(path, response)

    async def probe(self, path: str, timeout_s: float) -> bool:
        """Whether GET path answers 2xx in time (readiness): any failure is a plain no."""
        try:
            await self._send("GET", path, None, timeout_s)
        except (EngineUnavailableError, EngineBusyError, BackendRejectedError):
            return False
        return True

    async def _send(
        self, method: str, path: str, body: dict[str, Any] | None, timeout_s: float | None = None
    ) -> httpx.Response:
        where = f"{self.kind} at {self.url}"
        try:
            kwargs: dict[str, Any] = {"json": body} if body is not None else {}
            if timeout_s is not None:
                kwargs["timeout"] = timeout_s
            response = await self._http.request(method, path, **kwargs)
        except httpx.TimeoutException as exc:
            raise EngineUnavailableError(
                f"{where} did not answer {method} {path} in time ({type(exc).__name__})"
            ) from exc
        except httpx.HTTPError as exc:
            raise EngineUnavailableError(f"{where} is unreachable: {type(exc).__name__}: {exc}") from exc
        if response.is_success:
            return response
        detail = _error_message(response)
        status = response.status_code
        if status in _REJECTED:
            raise BackendRejectedError(f"{where} rejected the input (HTTP {status}): {detail}")
        if status == 429:
            raise EngineBusyError(f"{where} is busy (HTTP 429): {detail}")
        raise EngineUnavailableError(f"{where} failed {method} {path} with HTTP {status}: {detail}")

    def _json(self, path: str, response: httpx.Response) -> Any:
        try:
            return response.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise EngineUnavailableError(
                f"{self.kind} at {self.url} answered {path} with a body that is not JSON: {response.text[:200]!r}"
            ) from exc

    def malformed(self, path: str, what: str) -> EngineUnavailableError:
        """The error for a JSON answer that lacks what the wire format promises."""
        return EngineUnavailableError(f"{self.kind} at {self.url} answered {path} with a malformed body: {what}")

    async def close(self) -> None:
        await self._http.aclose()


def _error_message(response: httpx.Response) -> str:
    """The backend's own words: {"error": {"message"}} (SGLang, vLLM, OpenAI), {"message"}, or text."""
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return response.text[:300] or response.reason_phrase
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:300]
        if isinstance(error, str):
            return error[:300]
        if body.get("message"):
            return str(body["message"])[:300]
    return str(body)[:300]
