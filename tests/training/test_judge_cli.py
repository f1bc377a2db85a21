"""`egrm train-grm` on the command line: the training mix reaches the run; bad shares exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from egrm.cli import build_parser
from egrm.training.judge_examples import Mix


def _train_grm(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "egrm.cli", "train-grm", "--quiet", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_mix_flags_reach_the_training_record(tmp_path: Path) -> None:
    done = _train_grm(
        "--out",
        str(tmp_path),
        "--limit",
        "4",
        "--batch-size",
        "4",
        "--rank",
        "2",
        "--wrong-own",
        "1",
        "--short-share",
        "0",
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["steps"] == 1
    record = json.loads((tmp_path / "training.json").read_text())
    assert record["config"]["mix"] == {**asdict(Mix()), "short_share": 0.0, "wrong_own": 1.0}


@pytest.mark.parametrize("flag", ["--wrong-own", "--short-share", "--mixed-share"])
@pytest.mark.parametrize("value", ["1.5", "-0.1", "half"])
def test_a_share_outside_0_1_exits_2_naming_the_flag(flag: str, value: str, tmp_path: Path) -> None:
    done = _train_grm("--out", str(tmp_path), flag, value)
    assert done.returncode == 2
    assert f"argument {flag}" in done.stderr and done.stdout == ""
    assert not any(tmp_path.iterdir())  # nothing trained, nothing written


def test_the_mix_defaults_are_the_training_defaults() -> None:
    args = build_parser().parse_args(["train-grm", "--out", "adapter"])
    assert Mix(short_share=args.short_share, wrong_own=args.wrong_own, mixed_share=args.mixed_share) == Mix()
