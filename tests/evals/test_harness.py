"""The evaluation harness on the real model: four modes per item, and `egrm eval` end to end."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from egrm.engines.embedded.engine import EmbeddedEngine
from egrm.evals.data import builtin_arith
from egrm.evals.harness import EvalConfig, evaluate
from egrm.evals.report import summarise
from egrm.evals.runner import take
from egrm.pipeline.service import RewardPipeline
from egrm.pipeline.types import Route
from egrm.scorer.heuristic import HeuristicScorer

pytestmark = pytest.mark.slow


def test_each_mode_runs_and_routing_follows_consensus(exact_engine: EmbeddedEngine) -> None:
    items = take(builtin_arith("test"), 3)
    config = EvalConfig(long_max_tokens=8, extra=0)  # no adaptive samples: the modes' own tokens
    outcomes = asyncio.run(evaluate(RewardPipeline(exact_engine, HeuristicScorer()), items, config))
    for o in outcomes:
        assert set(o.runs) == {"routed", "short", "long", "early"}
        assert o.runs["short"].route is Route.SHORT and o.runs["long"].route is o.runs["early"].route is Route.LONG
        expected = Route.SHORT if o.consensus >= config.tau else Route.LONG
        assert o.runs["routed"].route is expected
        # Same seed, same samples: the routed answer is the forced mode's (tau sweeps rely on it);
        # routed long, it is the long path as served (early stop).
        assert o.runs["routed"].answer == o.runs["short" if expected is Route.SHORT else "early"].answer
        # Early stop: the first candidate alone, or (not accepted) all of them, as without it.
        assert len(o.runs["early"].candidates) in (1, config.m)
        assert o.runs["early"].candidates[0] == o.runs["long"].candidates[0]
        assert o.majority == o.runs["short"].answer
        # Both estimators on every item: the exact one from one greedy branch, its answer read too.
        assert 0 < o.estimates["exact"].consensus <= 1 and o.estimates["exact"].answer in ("Yes", "No")
        assert len(o.runs["long"].candidates) == config.m
        assert o.runs["long"].completion_tokens > o.runs["short"].completion_tokens
    report = summarise(outcomes, config)
    assert report["routed_matches_forced"] == 1.0
    assert report["n"] == 3 and set(report["by_difficulty"]) == {"easy", "medium", "hard"}
    assert set(report["consensus_estimators"]) == {"sampled", "exact"}


def test_routing_by_the_exact_estimate(exact_engine: EmbeddedEngine) -> None:
    items = take(builtin_arith("test"), 2)
    config = EvalConfig(long_max_tokens=8, consensus="exact", tau=0.5)
    outcomes = asyncio.run(evaluate(RewardPipeline(exact_engine, HeuristicScorer()), items, config))
    for o in outcomes:
        expected = Route.SHORT if o.estimates["exact"].consensus >= 0.5 else Route.LONG
        assert o.runs["routed"].route is expected and o.consensus == o.estimates["exact"].consensus
        assert o.runs["short"].answer == o.estimates["exact"].answer
    assert summarise(outcomes, config)["routed_matches_forced"] == 1.0


def _eval(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "egrm.cli", "eval", *args], capture_output=True, text=True, timeout=600
    )


def test_cli_prints_one_json_line_and_a_plot(tmp_path: Path) -> None:
    plot = tmp_path / "eval.png"
    load = ("--load-clients", "2", "--load-questions", "2", "--load-group", "3")
    done = _eval("--limit", "2", "--long-max-tokens", "8", "--json", "--plot", str(plot), *load)
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    report = json.loads(line)
    for key in ("n", "accuracy_routed", "accuracy_always_short", "accuracy_always_long", "short_path_rate",
                "short_path_accuracy", "latency_ratio_routed_vs_long", "latency_ms", "tokens_per_item",
                "by_difficulty", "calibration", "tau_curve"):  # fmt: skip
        assert key in report, key
    assert report["n"] == 2 and report["data"] == "builtin:arith"
    assert report["consensus_estimators"]["exact"]["tau_curve"][0]["tau"] == 0.6
    assert set(report["latency_ms"]["routed"]) == {"mean", "p50", "p99"}
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The frontier: every way to route, replayed from the same forced runs, and drawn beside.
    kinds = {p["kind"] for p in report["frontier"]}
    assert {"always", "vote", "exact", "adaptive"} <= kinds and report["routing"].startswith(("tau=", "calibrated"))
    (long,) = [p for p in report["frontier"] if p["name"] == "always long"]
    assert long["latency_ratio_routed_vs_long"] == 1.0 and long["accuracy_routed"] == report["accuracy_always_long"]
    assert (tmp_path / "eval_frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {"unanimous", "wrong", "by_kind"} <= set(report["short_path_slips"])
    assert "accuracy_routed" in done.stderr  # the table
    # Each policy's cost: tokens per item on the frontier, items/s under load beside always long.
    (early,) = [p for p in report["frontier"] if p["name"] == "always long, early stop"]
    assert 0 < early["completion_tokens"] <= long["completion_tokens"]
    assert report["accuracy_always_long_early_stop"] is not None and 0 <= report["early_stop_rate"] <= 1
    loaded = report["load"]
    assert (loaded["clients"], loaded["questions"], loaded["group"]) == (2, 2, 3)
    policies = {"always_short", "routed", "always_long_early_stop", "always_long"}
    assert set(loaded["policies"]) == set(loaded["items_per_s_vs_always_long"]) == policies
    assert loaded["items_per_s_vs_always_long"]["always_long"] == 1.0
    assert all(r["errors"] == 0 and r["items_per_s"] > 0 for r in loaded["policies"].values())


def test_cli_tau_sweep_runs_the_forced_modes_once(tmp_path: Path) -> None:
    done = _eval("--limit", "1", "--long-max-tokens", "8", "--json", "--sweep", "tau=0.6,1.0")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["sweep"] == "tau" and [r["tau"] for r in report["rows"]] == [0.6, 1.0]
    assert report["rows"][1]["short_path_rate"] <= report["rows"][0]["short_path_rate"]
    assert done.stderr.count("eval m=5") >= 1 and "tau | " in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--data", "/nonexistent.jsonl"], "no such file"),
        (["--split", "dev"], "split"),
        (["--sweep", "m=99"], "--sweep"),
        (["--modes", "short,sideways"], "--modes"),
        (["--load-clients", "-1"], "--load-clients"),
        (["--long-window", "9"], "--long-window"),
    ],
)
def test_cli_bad_arguments_exit_2_with_a_message(args: list[str], message: str) -> None:
    done = _eval(*args)
    assert done.returncode == 2
    assert message in done.stderr and done.stdout == ""


def test_calibrate_observes_the_judge_and_saves_its_signals(tmp_path) -> None:
    """`egrm calibrate` on a few real items: each observed down the short path with the greedy
    branch and the extra samples; three items certify nothing, so no policy is written."""
    from egrm.evals.calibration import Observed, main

    saved, out = tmp_path / "signals.jsonl", tmp_path / "policy.json"
    report = main("builtin:arith-mixed", "calibration", 3, 0.03, 0.9, 5, 0, out, signals_out=saved)
    observed = [Observed.from_json(line) for line in saved.read_text().splitlines()]
    assert report["n"] == len(observed) == 3 and report["policy"] is None and not out.exists()
    assert all(o.signals.exact is not None and o.signals.agrees is not None for o in observed)
    assert all(o.signals.consensus_all is not None for o in observed)  # the extra samples were drawn
