"""Start `egrm serve` as a real process on a free loopback port (benchmarks and tests)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def server_process(
    env: dict[str, str] | None = None, ready_timeout_s: float = 120
) -> Iterator[tuple[str, subprocess.Popen]]:
    """Yield (base URL, process) of a ready server; stop it on exit. Its log goes to a temp file."""
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="egrm-serve-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
        env={**os.environ, **(env or {})},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(proc, url, ready_timeout_s, log.name)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def running_server(env: dict[str, str] | None = None, ready_timeout_s: float = 120) -> Iterator[str]:
    """Yield the base URL of a ready server; stop it on exit."""
    with server_process(env, ready_timeout_s) as (url, _):
        yield url


def _wait_ready(proc: subprocess.Popen, url: str, timeout_s: float, log_path: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log_path) as f:
                raise RuntimeError(f"server exited with {proc.returncode}:\n{f.read()[-4000:]}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"server not ready after {timeout_s}s; log: {log_path}")
