"""Routing policies, their calibration and the frontier, on hand-made outcomes (no model)."""

from __future__ import annotations

import json
import zlib
from dataclasses import asdict

import pytest

from egrm.evals.calibration import Observed, choose, error_upper_bound, main
from egrm.evals.data import LabelledItem
from egrm.evals.frontier import frontier
from egrm.evals.harness import Estimate, ItemOutcome, ModeRun
from egrm.pipeline.routing import RoutingPolicy, Signals, threshold


def test_a_policy_routes_short_only_when_every_condition_it_sets_holds():
    policy = RoutingPolicy("p", 0.6, min_exact=0.5, require_agree=True, extra=5, borderline=1.0, min_consensus_all=0.9)
    assert policy.needs_exact and policy.wants_extra(0.8) and not policy.wants_extra(1.0)
    assert policy.short(Signals(1.0, exact=0.7, agrees=True))  # unanimous: no extra samples needed
    assert not policy.short(Signals(1.0, exact=0.4, agrees=True))  # the greedy answer is unsure
    assert not policy.short(Signals(1.0, exact=0.7, agrees=False))
    assert not policy.short(Signals(0.8, exact=0.7, agrees=True))  # borderline and no extra samples yet
    assert policy.short(Signals(0.8, exact=0.7, agrees=True, consensus_all=0.9))
    assert not policy.short(Signals(0.8, exact=0.7, agrees=True, consensus_all=0.8))
    assert not policy.short(Signals(0.4, exact=0.99, agrees=True, consensus_all=1.0))
    assert threshold(0.8).short(Signals(0.8)) and not threshold(0.8).short(Signals(0.6))
    with pytest.raises(ValueError, match="min_consensus_all"):
        RoutingPolicy("bad", 0.6, extra=3)


def test_a_policy_file_round_trips(tmp_path):
    policy = RoutingPolicy("p", 0.8, 0.6, True, calibration={"n": 10})
    policy.save(tmp_path / "policy.json")
    assert RoutingPolicy.load(tmp_path / "policy.json") == policy
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a routing policy"):
        RoutingPolicy.load(tmp_path / "bad.json")


def test_the_error_bound_is_clopper_pearsons():
    # No error in n: the bound solves (1 - p)^n = alpha.
    assert error_upper_bound(0, 100, 0.05) == pytest.approx(1 - 0.05 ** (1 / 100), abs=1e-6)
    assert error_upper_bound(3, 100, 0.05) > 0.03 and error_upper_bound(3, 10_000, 0.05) < 0.001
    assert error_upper_bound(0, 0, 0.05) == 1.0


def outcome(i: int, consensus: float, exact: float, short_right: bool, long_right: bool = True) -> ItemOutcome:
    item = LabelledItem(id=str(i), prompt="q", response="r", gold="Yes")
    wrong = "No"
    runs = {
        "short": ModeRun("Yes" if short_right else wrong, None, 100.0, 0, 0, extra_ms=20.0),
        "long": ModeRun("Yes" if long_right else wrong, None, 1000.0, 0, 0),
    }
    estimates = {
        "sampled": Estimate(consensus, "Yes" if short_right else wrong, "42"),
        "exact": Estimate(exact, "Yes" if short_right else wrong, "42"),
        "all": Estimate(consensus, "Yes" if short_right else wrong),
    }
    return ItemOutcome(item, estimates, runs)


def test_calibration_chooses_the_widest_policy_under_the_bound(tmp_path):
    # 300 unanimous items with a confident greedy answer, all right; 100 unanimous but unsure and
    # half wrong: only a policy that asks for the greedy answer's probability stays under 3%.
    outcomes = [outcome(i, 1.0, 0.9, True) for i in range(300)]
    outcomes += [outcome(300 + i, 1.0, 0.3, i % 2 == 0) for i in range(100)]
    items = [Observed.of(o) for o in outcomes]
    choice = choose(items, error=0.03, confidence=0.9, extra=5)
    assert choice.policy is not None and choice.policy.min_exact is not None and 0.3 < choice.policy.min_exact <= 0.9
    assert all(t.errors == 0 and t.short == 300 for t in choice.passed)
    assert choice.failed is not None and choice.failed.errors > 0  # the walk stopped at the first slip
    assert choose(items, error=0.001, confidence=0.9, extra=5).policy is None  # 150 items cannot show 0.1%
    assert choice.candidates > 50
    # Saved signals choose the same policy without the judge, and the policy is written where asked.
    (tmp_path / "signals.jsonl").write_text("".join(json.dumps(asdict(o)) + "\n" for o in items))
    report = main("d", "train", None, 0.03, 0.9, 5, 0, tmp_path / "p.json", signals_in=tmp_path / "signals.jsonl")
    assert RoutingPolicy.load(tmp_path / "p.json").key == choice.policy.key
    assert report["short"] == 300 and report["short_path_errors"] == 0


def test_a_slip_that_stops_the_sequence_leaves_bonferroni_to_certify_a_safer_policy():
    # 500 unanimous items, all right; 120 split votes (0.8), right on the first half of the split
    # (which orders the sequence: they make the boldest candidate look as safe as the others) and
    # one in four wrong on the second half, which stops the sequence at its first candidate.
    def second_half(i: int) -> bool:
        return zlib.crc32(str(i).encode()) % 2 == 1

    outcomes = [outcome(i, 1.0, 0.9, True) for i in range(500)]
    split = range(500, 620)
    outcomes += [outcome(i, 0.8, 0.9, not (second_half(i) and i % 4 == 0)) for i in split]
    items = [Observed.of(o) for o in outcomes]
    assert 8 <= sum(not o.right for o in items) <= 25
    choice = choose(items, error=0.03, confidence=0.9, extra=0)
    assert choice.failed is not None and choice.failed.policy.min_consensus < 1.0 and choice.failed.errors > 0
    assert choice.policy is not None and choice.policy.min_consensus == 1.0
    assert choice.by[choice.policy.key] == "Bonferroni" and set(choice.by.values()) == {"Bonferroni"}
    assert all(t.short == 500 and t.errors == 0 for t in choice.passed)
    # Without the split votes' slips the sequence certifies them too, and the bolder policy is chosen.
    clean = [Observed.of(outcome(i, 0.8, 0.9, True)) for i in split]
    bold = choose(items[:500] + clean, error=0.03, confidence=0.9, extra=0)
    assert bold.policy is not None and bold.policy.min_consensus < 1.0 and bold.by[bold.policy.key] == "both"


def test_the_frontier_replays_each_policy_from_the_forced_runs():
    outcomes = [outcome(0, 1.0, 0.9, True), outcome(1, 0.6, 0.5, False), outcome(2, 0.8, 0.6, True, False)]
    points = {p["name"]: p for p in frontier(outcomes, m=5, extra=5)}
    assert points["always long"]["accuracy_routed"] == round(2 / 3, 4)
    vote = points["vote, tau=0.8"]  # items 0 and 2 short (short latency 100 less the 20 of extra), 1 long
    assert vote["short_path_rate"] == round(2 / 3, 4) and vote["accuracy_routed"] == 1.0
    assert vote["latency_ratio_routed_vs_long"] == round((80 + 1000 + 80) / 3 / 1000, 4)
    adaptive = points["adaptive 0.6->0.9"]  # 0.6 and 0.8 draw 5 more (mean 5 + 10 / 3 samples)
    assert adaptive["mean_samples"] == round((5 + 10 + 10) / 3, 2)
