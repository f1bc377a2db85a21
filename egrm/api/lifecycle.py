"""Run a request's work under its deadline, and stop it when the client goes away."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from fastapi import Request

from egrm.api.errors import ApiError, ClientGoneError
from egrm.metrics import Metrics

T = TypeVar("T")


async def _disconnected(request: Request) -> None:
    # The body has been read; the next ASGI message is the disconnect (or nothing, until the
    # response is sent).
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def guarded(request: Request, work: Coroutine[Any, Any, T], timeout_s: float, metrics: Metrics) -> T:
    """Await work; cancel it at the deadline (504) or when the client disconnects.

    Cancelling reaches the engine: queued jobs of this request are dropped before they run.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        task.cancel()
        if watcher in done:
            metrics.cancelled.labels(reason="disconnect").inc()
            raise ClientGoneError
        metrics.cancelled.labels(reason="deadline").inc()
        raise ApiError(504, f"request exceeded EGRM_REQUEST_TIMEOUT_S={timeout_s:g}s", None, "timeout_error")
    finally:
        watcher.cancel()
