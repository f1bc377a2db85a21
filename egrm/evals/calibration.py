"""`egrm calibrate`: choose the judge's routing policy on labelled items, with a stated error bound.

Every calibration item runs once down the short path (seeded; with the greedy branch and adaptive
M's extra samples), which gives its signals (routing.py) and whether each short answer is right.
Each candidate policy then sends some items short. The guarantee rests on two tests, each at half
the risk, and the union of what they certify (a union bound: the chance that either certifies a
policy whose error is above the bound is at most the risk asked, 1 - confidence):

- Learn-then-Test's fixed sequence (Angelopoulos et al., 2021): the items are split in two; the
  first half orders the candidates from safest to boldest (by their error bound there); the second
  half tests them in that order, each with a one-sided Clopper-Pearson bound, and the walk stops
  at the first that fails. It certifies bold candidates from few items, but it certifies nothing
  when its first candidate slips on the second half (no error on one half and four on the other is
  chance at a 1.6% error).
- Bonferroni over every candidate on every item: each is tested on all of them at the risk shared
  out among the candidates. It needs several hundred short items with few errors, and then a slip
  of one bold candidate does not stop the others.

Of the candidates certified, the one that sends the most items short is chosen.
Evaluation must run on other items (`egrm eval` on the test split): the policy is never scored on
what it was fitted on.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import date
from pathlib import Path
from typing import Any

from egrm.evals.frontier import signals
from egrm.evals.harness import ItemOutcome
from egrm.pipeline.routing import RoutingPolicy, Signals

MIN_CONSENSUS = (0.6, 0.8, 1.0)
MIN_EXACT: tuple[float | None, ...] = (None, 0.5, 0.6, 0.7, 0.8, 0.9)
MIN_ALL = (0.8, 0.9, 1.0)


@dataclass(frozen=True, slots=True)
class Observed:
    """One calibration item as the candidate policies see it (`--save-signals` writes these)."""

    id: str
    signals: Signals
    right: bool  # the first M samples' majority is the gold verdict
    right_all: bool  # the majority over every sample drawn (the first M and adaptive M's extra)

    @classmethod
    def of(cls, o: ItemOutcome) -> Observed:
        every = o.estimates.get("all", o.estimates["sampled"])
        return cls(o.item.id, signals(o), o.estimates["sampled"].answer == o.item.gold, every.answer == o.item.gold)

    @classmethod
    def from_json(cls, line: str) -> Observed:
        row = json.loads(line)
        return cls(row["id"], Signals(**row["signals"]), row["right"], row["right_all"])


def binomial_cdf(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def error_upper_bound(errors: int, n: int, alpha: float) -> float:
    """One-sided Clopper-Pearson upper bound: the largest error rate under which seeing at most
    `errors` wrong in n has probability at least alpha (bisection on the binomial CDF)."""
    if errors >= n:  # every one wrong, or none seen
        return 1.0
    lo, hi = errors / n, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if binomial_cdf(errors, n, mid) > alpha else (lo, mid)
    return hi


def candidates(extra: int) -> list[RoutingPolicy]:
    """The policies tried: a vote threshold, optionally the greedy answer's probability and its
    agreeing with the vote, and optionally adaptive M on a vote that is not unanimous."""
    out = []
    for lo in MIN_CONSENSUS:
        for q in MIN_EXACT:
            for agree in (False, True):
                out.append(RoutingPolicy("calibrated", lo, q, agree))
                if extra and lo < 1.0:
                    for hi in MIN_ALL:
                        out.append(RoutingPolicy("calibrated", lo, q, agree, extra, 1.0, hi))
    return out


@dataclass(frozen=True, slots=True)
class Tried:
    """A candidate on some items: how many it sends short, how many of those are wrong, the bound."""

    policy: RoutingPolicy
    short: int
    errors: int
    upper: float  # the short path's error, at most, with the confidence asked

    def row(self) -> dict[str, Any]:
        return {
            "policy": self.policy.describe(),
            "short": self.short,
            "errors": self.errors,
            "error_upper": round(self.upper, 4),
        }


def try_policy(policy: RoutingPolicy, items: Sequence[Observed], alpha: float) -> Tried:
    short = errors = 0
    for o in items:
        if policy.short(o.signals):
            short += 1
            errors += not (o.right_all if policy.wants_extra(o.signals.consensus) else o.right)
    return Tried(policy, short, errors, error_upper_bound(errors, short, alpha))


@dataclass(frozen=True, slots=True)
class Choice:
    policy: RoutingPolicy | None  # None: no candidate passed; route on tau
    passed: list[Tried]  # on every item, the candidates certified (the sequence's first, in its order)
    failed: Tried | None  # on the second half, the one that stopped the sequence
    candidates: int
    by: dict[tuple[Any, ...], str] = field(default_factory=dict)  # per certified policy's key: which test did


def fixed_sequence(
    items: Sequence[Observed], pool: list[RoutingPolicy], error: float, alpha: float
) -> tuple[list[RoutingPolicy], Tried | None]:
    """Learn-then-Test's fixed sequence: the candidates that pass, in order, and the one that stopped it."""
    # Split by a hash of the id: stable across runs and blind to the order the items come in.
    order = [o for o in items if zlib.crc32(o.id.encode()) % 2 == 0]
    test = [o for o in items if zlib.crc32(o.id.encode()) % 2 == 1]
    ranked = sorted((try_policy(p, order, alpha) for p in pool), key=lambda t: (t.upper, -t.short))
    passed: list[RoutingPolicy] = []
    for policy in (t.policy for t in ranked):
        tried = try_policy(policy, test, alpha)
        if not tried.short or tried.upper > error:
            return passed, tried
        passed.append(policy)
    return passed, None


def choose(items: Sequence[Observed], error: float, confidence: float, extra: int) -> Choice:
    """The fixed sequence and Bonferroni, each at half the risk (see the module's docstring); among
    the candidates either certified, the one that sends the most items short (ties: fewer extra
    samples, then the simpler)."""
    alpha = 1 - confidence
    pool = candidates(extra)
    in_sequence, failed = fixed_sequence(items, pool, error, alpha / 2)
    each = [try_policy(p, items, alpha / 2 / len(pool)) for p in pool]
    bonferroni = [t.policy for t in each if t.short and t.upper <= error]
    by = {p.key: "fixed sequence" for p in in_sequence}
    for p in bonferroni:
        by[p.key] = "both" if p.key in by else "Bonferroni"
    certified = in_sequence + [p for p in bonferroni if p not in in_sequence]
    on_all = [try_policy(p, items, alpha) for p in certified]
    if not on_all:
        return Choice(None, [], failed, len(pool))
    best = max(on_all, key=lambda t: (t.short, -t.policy.extra, -(t.policy.min_exact or 0), -t.policy.require_agree))
    return Choice(best.policy, on_all, failed, len(pool), by)


def describe(
    policy: RoutingPolicy, choice: Choice, n: int, error: float, confidence: float, source: dict[str, Any]
) -> RoutingPolicy:
    """The policy with where it came from, for the file and for whoever reads it."""
    (mine,) = [t for t in choice.passed if t.policy == policy]
    record = {
        **source,
        "n": n,
        "short": mine.short,
        "short_path_rate": round(mine.short / n, 4),
        "short_path_errors": mine.errors,
        "error_bound": error,
        "confidence": confidence,
        "method": "fixed sequence (learn-then-test) and Bonferroni, each at half the risk; Clopper-Pearson",
        "certified_by": choice.by[policy.key],
        "candidates": choice.candidates,
        "date": date.today().isoformat(),
    }
    return replace(policy, name=f"calibrated on {source.get('data', 'data')}", calibration=record)


def observe(data: str, split: str, limit: int | None, extra: int, seed: int) -> list[Observed]:
    """Run the calibration items down the short path with the judge's own signals (no policy)."""
    import asyncio
    import sys

    from tqdm import tqdm

    from egrm.config import Settings
    from egrm.evals.data import load_dataset
    from egrm.evals.harness import EvalConfig, evaluate
    from egrm.evals.runner import take
    from egrm.factory import pipeline_from

    settings = Settings(routing_policy="none")  # the signals of the judge itself, not of an old policy
    items = take(load_dataset(data, split), limit)
    config = EvalConfig(modes=("short",), extra=extra, seed=seed)

    async def run() -> list[ItemOutcome]:
        async with pipeline_from(settings) as pipeline:
            with tqdm(total=len(items), desc="calibrate", file=sys.stderr, unit="item") as bar:
                return await evaluate(pipeline, items, config, progress=lambda: bar.update(1))

    return [Observed.of(o) for o in asyncio.run(run())]


def main(
    data: str,
    split: str,
    limit: int | None,
    error: float,
    confidence: float,
    extra: int,
    seed: int,
    out: Path | None,
    signals_in: Path | None = None,
    signals_out: Path | None = None,
) -> dict[str, Any]:
    """Observe the calibration items (or read what an earlier run saved), choose, and write the
    policy (beside the judge unless `out` says where). Returns the choice and what it rests on."""
    from egrm.config import Settings
    from egrm.factory import policy_beside_judge

    if signals_in is not None:
        items = [Observed.from_json(line) for line in signals_in.read_text().splitlines() if line.strip()]
    else:
        items = observe(data, split, limit, extra, seed)
    if signals_out is not None:
        signals_out.write_text("".join(json.dumps(asdict(o)) + "\n" for o in items))
    choice = choose(items, error, confidence, extra)
    report: dict[str, Any] = {
        "data": data,
        "split": split,
        "n": len(items),
        "error_bound": error,
        "confidence": confidence,
        "candidates": choice.candidates,
        "passed": [t.row() | {"certified_by": choice.by[t.policy.key]} for t in choice.passed],
        "stopped_at": choice.failed.row() if choice.failed else None,
    }
    if choice.policy is None:
        return report | {"policy": None}
    chosen = describe(choice.policy, choice, len(items), error, confidence, {"data": data, "split": split})
    out = out or policy_beside_judge(Settings())
    chosen.save(out)
    return report | {"policy": chosen.describe(), "written": str(out), **chosen.calibration}
