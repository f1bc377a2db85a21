"""Start `egrm serve`, `egrm scorer`, llama.cpp's `llama-server`, a vLLM server or a Redis server as
a real process on a loopback port (benchmarks and tests)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from egrm.llamacpp_local import server_binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def egrm_process(
    command: str,
    env: dict[str, str] | None = None,
    ready_timeout_s: float = 120,
    port: int | None = None,
    args: Sequence[str] = (),
) -> Iterator[tuple[str, subprocess.Popen]]:
    """Yield (base URL, process) of `egrm <command>` once its /readyz answers 200; stop it on exit.

    A given port lets a test restart a process where its clients expect it. The log goes to a temp file.
    """
    port = port or free_port()
    log = tempfile.NamedTemporaryFile(prefix=f"egrm-{command}-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [sys.executable, "-m", "egrm.cli", command, "--host", "127.0.0.1", "--port", str(port), *args],
        env={**os.environ, **(env or {})},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(proc, url, ready_timeout_s, log.name)
        yield url, proc
    finally:
        _stop(proc)


@contextmanager
def server_process(
    env: dict[str, str] | None = None, ready_timeout_s: float = 120
) -> Iterator[tuple[str, subprocess.Popen]]:
    """Yield (base URL, process) of a ready `egrm serve`; stop it on exit."""
    with egrm_process("serve", env, ready_timeout_s) as running:
        yield running


@contextmanager
def running_server(env: dict[str, str] | None = None, ready_timeout_s: float = 120) -> Iterator[str]:
    """Yield the base URL of a ready server; stop it on exit."""
    with server_process(env, ready_timeout_s) as (url, _):
        yield url


@contextmanager
def scorer_process(
    port: int | None = None, args: Sequence[str] = (), ready_timeout_s: float = 60
) -> Iterator[tuple[str, subprocess.Popen]]:
    """Yield (base URL, process) of a ready `egrm scorer` worker; stop it on exit."""
    with egrm_process("scorer", port=port, args=args, ready_timeout_s=ready_timeout_s) as running:
        yield running


@contextmanager
def llama_server(
    model: Path,
    cache_dir: Path,
    port: int,
    slots: int = 5,
    threads: int = 0,
    context: int = 8192,
    alias: str = "",
    args: Sequence[str] = (),
    ready_timeout_s: float = 120,
) -> Iterator[subprocess.Popen]:
    """A llama-server (built by `make llama-server`) on 127.0.0.1:port serving `model`, up until its
    /health answers; stopped on exit. `slots` parallel sequences share one unified KV of `context`
    tokens (so an n_cmpl call's children fit beside other requests)."""
    log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)
    command = [
        str(server_binary(cache_dir)),
        *("-m", str(model), "--host", "127.0.0.1", "--port", str(port)),
        *("-np", str(slots), "-c", str(context), "-t", str(threads or os.cpu_count() or 1)),
        *("--kv-unified", "--metrics", "--no-webui"),
        *(("--alias", alias) if alias else ()),
        *args,
    ]
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_ready(proc, f"http://127.0.0.1:{port}", ready_timeout_s, log.name, "/health")
        yield proc
    finally:
        _stop(proc)


# Keep in step with deploy/vllm/install.sh (`make vllm` installs it into the user cache).
@contextmanager
def redis_server(port: int | None = None, maxmemory_mb: int = 64) -> Iterator[tuple[str, subprocess.Popen]]:
    """Yield (redis:// URL, process) of a redis-server (Debian's, `make redis`) on 127.0.0.1:port,
    in memory only, bounded as the deployments bound it (maxmemory, allkeys-lru); stopped on exit.
    A given port lets a test start it again where its clients expect it."""
    port = port or free_port()
    command = [
        "redis-server",
        *("--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"),
        *("--maxmemory", f"{maxmemory_mb}mb", "--maxmemory-policy", "allkeys-lru"),
    ]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
                conn.sendall(b"PING\r\n")
                if conn.recv(16).startswith(b"+PONG"):
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not answer on port {port} (exit code {proc.poll()})")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0", proc
    finally:
        _stop(proc)


VLLM_VERSION = "0.32.0"


def vllm_python(cache_dir: Path) -> Path:
    """The interpreter of the venv `make vllm` made for vLLM's CPU build (its own: vLLM pins its own
    transformers)."""
    python = cache_dir / "vllm" / VLLM_VERSION / "bin" / "python"
    if not python.exists():
        raise FileNotFoundError(f"no vLLM venv at {python.parent.parent}: run `make vllm` (installs it once)")
    return python


@contextmanager
def vllm_server(
    model: Path,
    cache_dir: Path,
    port: int,
    served_name: str = "",
    dtype: str = "bfloat16",
    kv_cache_gib: int = 2,
    eager: bool = False,
    args: Sequence[str] = (),
    ready_timeout_s: float = 300,
    scheduling: str = "priority",
) -> Iterator[subprocess.Popen]:
    """vLLM's OpenAI-compatible server (the CPU build `make vllm` installs) on 127.0.0.1:port serving
    the model folder, up once its /health answers; stopped on exit with every process it started.

    The flags are the ones measured on these machines (docs/engines.md, "vLLM"): 32-token KV blocks
    (CPU needs a multiple of 32; only full blocks are prefix-cached), prompts prefilled whole, the
    cached prompt tokens in each answer's usage, no sampling defaults from generation_config.json,
    no access log line per call, scheduling by request priority (`scheduling`: vLLM's
    --scheduling-policy; "fcfs" is vLLM's own default). eager: no torch.compile warm-up
    (ready in about 30 s here instead of 115-140 s; the tests' choice, not the benchmarks'). Dev mode serves
    POST /reset_prefix_cache, which benchmarks use to start each contender on a cold cache."""
    log = tempfile.NamedTemporaryFile(prefix="vllm-", suffix=".log", delete=False)
    command = [
        str(vllm_python(cache_dir)),
        *("-m", "vllm.entrypoints.openai.api_server", "--model", str(model)),
        *("--host", "127.0.0.1", "--port", str(port), "--dtype", dtype),
        *("--block-size", "32", "--max-model-len", "8192", "--generation-config", "vllm"),
        # vLLM 0.32's CPU worker crashes its engine when a seeded request's prefill is split in
        # chunks (`CPU Generator does not use offset`, gpu_model_runner._bookkeeping_sync): every
        # prompt is prefilled whole, in a step budget that holds the longest.
        *("--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192"),
        *("--enable-prompt-tokens-details", "--disable-uvicorn-access-log"),
        # egrm's spare and background calls carry a request priority: live work starts first.
        *("--scheduling-policy", scheduling),
        *(("--served-model-name", served_name) if served_name else ()),
        *(("--enforce-eager",) if eager else ()),
        *args,
    ]
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{(os.cpu_count() or 1) - 1}",
        "VLLM_SERVER_DEV_MODE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    # Its own session: the API server starts an engine-core and a worker process, all stopped together.
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        _wait_ready(proc, f"http://127.0.0.1:{port}", ready_timeout_s, log.name, "/health")
        yield proc
    finally:
        _stop_group(proc)


def vllm_counters(url: str, *names: str) -> dict[str, float]:
    """vLLM's counters of those names at url/metrics, each summed over its label sets (a name vLLM
    does not expose yet is left out)."""
    totals: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        for name in names:
            if line.startswith(name + "{"):
                totals[name] = totals.get(name, 0.0) + float(line.split()[-1])
    return totals


def _stop_group(proc: subprocess.Popen) -> None:
    """Stop a process and everything in its session (it leads one: start_new_session=True)."""
    for sig in (signal.SIGCONT, signal.SIGTERM):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)  # a test may have stopped it; SIGTERM waits for SIGCONT
        proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait_ready(proc: subprocess.Popen, url: str, timeout_s: float, log_path: str, path: str = "/readyz") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log_path) as f:
                raise RuntimeError(f"process exited with {proc.returncode}:\n{f.read()[-4000:]}")
        try:
            if httpx.get(f"{url}{path}", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"not ready after {timeout_s}s; log: {log_path}")
