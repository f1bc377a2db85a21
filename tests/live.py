"""A real uvicorn server on a loopback port, in a thread, serving an app built on the shared engine.

Real HTTP end to end without loading the model again for every server (the engine fixture is
session-scoped and loop-agnostic: TestClient and uvicorn threads share it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import uvicorn
from fastapi import FastAPI

from loadtest.serverproc import free_port


@contextmanager
def serve(app: FastAPI, ready_timeout_s: float = 30) -> Iterator[str]:
    """Yield the base URL of `app` served by uvicorn on 127.0.0.1; shut it down on exit."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + ready_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"uvicorn did not start on port {port}")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def wait_for(predicate: Callable[[], bool], timeout_s: float = 60) -> bool:
    """Whether predicate() comes true within timeout_s (polled every 0.1 s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def metric(url: str, series: str) -> float:
    """The value of `series` (name plus labels exactly as exposed) at url/metrics; 0 when absent."""
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0
