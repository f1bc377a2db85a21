"""train-grm writes an adapter; the loader merges an adapter once and serves the merged weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from egrm.config import Settings
from egrm.engines.embedded.adapter import adapter_digest, merged_dir, merged_model
from egrm.engines.embedded.fetch import model_dir
from egrm.factory import adapter_path
from egrm.judge import DEFAULT_ADAPTER
from egrm.training.judge_train import GrmTrainConfig, train_grm

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base() -> Path:
    return model_dir(Settings().cache_dir)


@pytest.fixture(scope="module")
def tiny_adapter(base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("adapter")
    config = GrmTrainConfig(rank=2, alpha=4, lr=5e-3, batch_size=4, limit=8, budget_s=60, warmup_steps=1)
    meta = train_grm(base, out, config, progress=False)
    assert meta["steps"] == 2 and meta["items"] == 8 and meta["learnt_tokens"] > 0
    return out


def test_train_grm_writes_a_bf16_adapter_and_its_record(tiny_adapter: Path) -> None:
    weights = load_file(tiny_adapter / "adapter_model.safetensors")
    assert weights and all(t.dtype == torch.bfloat16 for t in weights.values())
    assert any("lora_B" in k and t.abs().sum() > 0 for k, t in weights.items())  # B starts at zero: it learnt
    config = json.loads((tiny_adapter / "adapter_config.json").read_text())
    assert config["r"] == 2 and set(config["target_modules"]) >= {"q_proj", "down_proj"}
    record = json.loads((tiny_adapter / "training.json").read_text())
    assert record["steps"] == 2 and record["tokens_per_s"] > 0 and record["config"]["rank"] == 2


def test_train_grm_continues_an_adapter(base: Path, tiny_adapter: Path, tmp_path: Path) -> None:
    config = GrmTrainConfig(rank=8, lr=5e-3, batch_size=4, limit=4, budget_s=60, warmup_steps=1, init=str(tiny_adapter))
    meta = train_grm(base, tmp_path, config, progress=False)
    assert meta["steps"] == 1
    assert json.loads((tmp_path / "adapter_config.json").read_text())["r"] == 2  # the init's rank, not 8
    assert json.loads((tmp_path / "training.json").read_text())["config"]["rank"] == 2
    before, after = (
        load_file(tiny_adapter / "adapter_model.safetensors"),
        load_file(tmp_path / "adapter_model.safetensors"),
    )
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # trained on from there


def test_merge_adds_the_low_rank_update_once(base: Path, tiny_adapter: Path, tmp_path: Path) -> None:
    merged = merged_model(base, tiny_adapter, tmp_path)
    assert merged == merged_dir(base, tiny_adapter, tmp_path) and (merged / "tokenizer.json").exists()
    lora = load_file(tiny_adapter / "adapter_model.safetensors")
    key = "base_model.model.model.layers.3.self_attn.q_proj"
    a, b = lora[f"{key}.lora_A.weight"].float(), lora[f"{key}.lora_B.weight"].float()
    name = "model.layers.3.self_attn.q_proj.weight"
    before = load_file(base / "model.safetensors")[name].float()
    after = load_file(merged / "model.safetensors")[name]
    assert after.dtype == torch.bfloat16  # saved in the base's dtype
    expected = (before + (4 / 2) * b @ a).to(torch.bfloat16)  # scale = alpha / r
    assert torch.equal(after, expected)
    stamp = (merged / ".egrm-merged").stat().st_mtime_ns
    assert merged_model(base, tiny_adapter, tmp_path) == merged  # cached: not merged again
    assert (merged / ".egrm-merged").stat().st_mtime_ns == stamp


def test_another_adapter_gets_its_own_folder(tiny_adapter: Path, tmp_path: Path) -> None:
    assert adapter_digest(tiny_adapter) != adapter_digest(DEFAULT_ADAPTER)
    with pytest.raises(FileNotFoundError, match="adapter_config.json is missing"):
        adapter_digest(tmp_path)


def test_which_adapter_is_served(tmp_path: Path, base: Path) -> None:
    assert adapter_path(Settings()) == DEFAULT_ADAPTER  # the default model gets the judge adapter
    assert adapter_path(Settings(adapter="none")) is None
    assert adapter_path(Settings(model=str(base))) is None  # another model: no adapter unless named
    assert adapter_path(Settings(model=str(base), adapter=str(tmp_path))) == tmp_path
    with pytest.raises(ValueError, match="EGRM_ADAPTER"):
        Settings(adapter=str(tmp_path / "missing"))
