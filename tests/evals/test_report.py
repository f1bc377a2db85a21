"""The report's arithmetic on hand-built outcomes: accuracy, routing, calibration, tau curve."""

from __future__ import annotations

import pytest

from egrm.evals.data import LabelledItem
from egrm.evals.harness import Estimate, EvalConfig, ItemOutcome, ModeRun
from egrm.evals.report import self_bleu, summarise
from egrm.evals.runner import Sweep, rerouted, take
from egrm.pipeline.types import Route


def _outcome(
    gold: str, consensus: float, majority: str, long_answer: str, exact: Estimate, tau: float = 0.8
) -> ItemOutcome:
    item = LabelledItem(id="x", prompt="p", response="r", gold=gold, difficulty="easy" if gold == "Yes" else "hard")
    short = ModeRun(majority, Route.SHORT, 100.0, 50, 5)
    long = ModeRun(long_answer, Route.LONG, 1000.0, 200, 300, candidates=["a b c d", "a b c e"])
    routed = short if consensus >= tau else long
    estimates = {"sampled": Estimate(consensus, majority), "exact": exact}
    return ItemOutcome(item, estimates, {"routed": routed, "short": short, "long": long})


OUTCOMES = [
    _outcome("Yes", 1.0, "Yes", "Yes", Estimate(0.97, "Yes")),  # sure and right
    _outcome("No", 0.8, "Yes", "No", Estimate(0.55, "Yes")),  # sampled sure and wrong; exact unsure
    _outcome("No", 0.6, "Yes", "No", Estimate(0.41, "No")),  # unsure, reasoning fixes it
    _outcome("Yes", 0.6, "No", "No", Estimate(0.83, "Yes")),  # sampled unsure; exact sure and right
]


def test_accuracy_routing_and_latency() -> None:
    r = summarise(OUTCOMES, EvalConfig())
    assert (r["n"], r["accuracy_routed"], r["accuracy_always_short"], r["accuracy_always_long"]) == (4, 0.5, 0.25, 0.75)
    assert (r["short_path_rate"], r["short_path_accuracy"], r["long_path_accuracy"]) == (0.5, 0.5, 0.5)
    assert r["routed_matches_forced"] == 1.0
    assert r["latency_ratio_routed_vs_long"] == pytest.approx((100 + 100 + 1000 + 1000) / 4 / 1000)
    assert r["latency_ms"]["always_short"]["p50"] == 100.0
    assert r["tokens_per_item"]["always_long"] == {"prompt": 200.0, "completion": 300.0}
    assert r["by_difficulty"]["easy"]["n"] == 2 and r["by_difficulty"]["hard"]["accuracy_always_long"] == 1.0


def test_calibration_and_tau_curve() -> None:
    r = summarise(OUTCOMES, EvalConfig())
    assert r["calibration"] == [
        {"consensus": 0.6, "n": 2, "accuracy": 0.0},
        {"consensus": 0.8, "n": 1, "accuracy": 0.0},
        {"consensus": 1.0, "n": 1, "accuracy": 1.0},
    ]
    curve = {row["tau"]: row for row in r["tau_curve"]}
    assert curve[0.6]["short_path_rate"] == 1.0 and curve[0.6]["accuracy_routed"] == 0.25
    assert curve[0.9]["short_path_rate"] == 0.25 and curve[0.9]["accuracy_routed"] == 0.75
    assert curve[0.8]["accuracy_routed"] == r["accuracy_routed"]


def test_both_estimators_side_by_side() -> None:
    r = summarise(OUTCOMES, EvalConfig())
    sampled, exact = r["consensus_estimators"]["sampled"], r["consensus_estimators"]["exact"]
    assert sampled["short_path_rate"] == r["short_path_rate"] and sampled["tau_curve"] == r["tau_curve"]
    # exact at tau 0.8: items 1 and 4 go short, both right; items 2 and 3 take the long path (right)
    assert (exact["short_path_rate"], exact["short_path_accuracy"], exact["accuracy_routed"]) == (0.5, 1.0, 1.0)
    assert exact["accuracy_short_answer"] == 0.75 and exact["mean_consensus"] == pytest.approx(0.69)
    assert exact["calibration"] == [
        {"consensus": 0.4, "n": 1, "accuracy": 1.0},
        {"consensus": 0.5, "n": 1, "accuracy": 0.0},
        {"consensus": 0.8, "n": 1, "accuracy": 1.0},
        {"consensus": 0.9, "n": 1, "accuracy": 1.0},
    ]
    routed_by_exact = summarise(OUTCOMES, EvalConfig(consensus="exact"))
    assert routed_by_exact["calibration"] == exact["calibration"]
    assert routed_by_exact["tau_curve"] == exact["tau_curve"]


def test_rerouting_matches_a_routed_run_at_that_tau() -> None:
    at_09 = summarise(rerouted(OUTCOMES, 0.9), EvalConfig(tau=0.9))
    assert at_09["short_path_rate"] == 0.25 and at_09["accuracy_routed"] == 0.75
    assert at_09["routed_matches_forced"] == 1.0


def test_short_only_runs_still_report_routing() -> None:
    short_only = [ItemOutcome(o.item, o.estimates, {"short": o.runs["short"]}) for o in OUTCOMES]
    r = summarise(short_only, EvalConfig())
    assert r["short_path_rate"] == 0.5 and r["short_path_accuracy"] == 0.5
    assert "accuracy_routed" not in r and "tau_curve" not in r and "diversity" not in r


def test_self_bleu() -> None:
    assert self_bleu(["the cat sat on the mat"] * 3) == pytest.approx(1.0)
    assert self_bleu(["alpha beta gamma delta", "one two three four"]) == pytest.approx(0.0)
    assert self_bleu(["only one"]) is None


def test_take_keeps_each_difficulty_share() -> None:
    items = [LabelledItem(str(i), "p", "r", "Yes", difficulty=d) for i, d in enumerate("aaaaaabbbccc")]
    assert [i.difficulty for i in take(items, 6)] == list("abcabc")
    assert len(take(items, None)) == 12


@pytest.mark.parametrize("text", ["m=0", "m=x", "tau=1.5", "strategy=hot", "top_p=0.9", "m="])
def test_bad_sweeps_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--sweep"):
        Sweep.parse(text)


def test_sweeps_parse() -> None:
    assert Sweep.parse("m=3,5").values == (3, 5)
    assert Sweep.parse("tau=0.6, 1").values == (0.6, 1.0)
    assert Sweep.parse("strategy=ladder,fixed,nucleus").name == "strategy"


def test_the_frontier_plot_draws_the_load_panel_only_beside_its_baseline(tmp_path) -> None:
    from egrm.evals.plots import plot_frontier

    point = {"name": "always long", "kind": "always", "short_path_rate": 0.0, "accuracy_routed": 0.9,
             "latency_ratio_routed_vs_long": 1.0, "completion_tokens": 280.0}  # fmt: skip
    run = {"items_per_s": 7.0, "accuracy": 0.9}
    without = {"clients": 16, "group": 4, "policies": {"always_long_early_stop": run}}  # --modes without long
    with_base = {**without, "items_per_s_vs_always_long": {"always_long_early_stop": 1.5}}
    for load in (None, without, with_base):
        path = plot_frontier([point], tmp_path / "frontier.png", load)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
