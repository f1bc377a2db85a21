"""uvicorn's HTTP/1.1 protocol with a deadline on request headers.

uvicorn times out idle keep-alive connections but not a client that opens a connection and
sends its headers a byte at a time: each such connection is held for ever (slowloris). Here a
connection that has not sent a whole request head within the deadline, from connecting or
from the end of its last response, is closed. Bodies have their own deadline (egrm.api.guards).
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol


class HeaderDeadlineProtocol(H11Protocol):
    def __init__(self, *args: Any, header_timeout_s: float, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._header_timeout_s = header_timeout_s
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._in_request():
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self._in_request():
            self._arm()  # the next request's head is due within the deadline too

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _in_request(self) -> bool:
        """A request's head has arrived and its response is not complete."""
        return self.cycle is not None and not self.cycle.response_complete

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self._header_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expire(self) -> None:
        self._header_timer = None
        if not self._in_request() and not self.transport.is_closing():
            self.transport.close()


def with_header_deadline(timeout_s: float) -> type[H11Protocol]:
    """The protocol class to give uvicorn (`http=`), bound to a header deadline."""
    return functools.partial(HeaderDeadlineProtocol, header_timeout_s=timeout_s)  # type: ignore[return-value]
