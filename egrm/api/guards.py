"""ASGI guards in front of every route: API keys, the request-body limit and its read deadline."""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from egrm.api.errors import error_response


class GuardMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        api_keys: Iterable[str],
        open_paths: Iterable[str],
        max_body_bytes: int,
        limit_name: str = "EGRM_MAX_BODY_BYTES",  # what the 413 message names as the limit
        body_timeout_s: float = 30.0,
    ):
        self.app = app
        self._limit_name = limit_name
        self._body_timeout_s = body_timeout_s
        self._keys = [k.encode() for k in api_keys]
        self._open = set(open_paths)
        self._max_body = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if self._keys and scope["path"] not in self._open and not self._authorized(headers.get(b"authorization")):
            response = error_response(
                401,
                "authentication_error",
                "missing or invalid API key: send 'Authorization: Bearer <key>'",
                "Authorization",
                headers={"WWW-Authenticate": "Bearer"},
            )
            await response(scope, receive, send)
            return
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._max_body:
            await self._too_large(scope, receive, send)
            return
        # The whole body is read here, within the limit and the deadline, then replayed: a client
        # that trickles it (or declares more than it sends) cannot hold a connection for ever.
        messages: list[Message] = []
        seen = 0
        try:
            async with asyncio.timeout(self._body_timeout_s):
                while True:
                    message = await receive()
                    messages.append(message)
                    if message["type"] != "http.request":
                        break
                    seen += len(message.get("body", b""))
                    if seen > self._max_body:
                        await self._too_large(scope, receive, send)
                        return
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            text = f"the request body did not arrive within EGRM_BODY_TIMEOUT_S={self._body_timeout_s:g}s"
            await error_response(408, "timeout_error", text, "body", {"Connection": "close"})(scope, receive, send)
            return
        await self.app(scope, _replay(messages, receive), send)

    def _authorized(self, header: bytes | None) -> bool:
        scheme, _, token = (header or b"").partition(b" ")
        if scheme.lower() != b"bearer" or not token:
            return False
        # Compare with every key, whatever the outcome, in constant time per key.
        matches = [hmac.compare_digest(token.strip(), key) for key in self._keys]
        return any(matches)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = f"request body exceeds {self._limit_name}={self._max_body} bytes"
        await error_response(413, "invalid_request_error", message, "body")(scope, receive, send)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed
