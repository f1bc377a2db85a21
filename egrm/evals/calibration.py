"""`egrm calibrate`: choose the judge's routing policy on labelled items, with a stated error bound.

Every calibration item runs once down the short path (seeded; with the greedy branch and adaptive
M's extra samples), which gives its signals (routing.py) and whether each short answer is right.
Each candidate policy then sends some items short; among the candidates whose short-path error
stays under the bound with the stated confidence, the one that sends the most items short wins.
The confidence is a one-sided Clopper-Pearson bound on the short path's error, split over all the
candidates tried (Bonferroni), since the choice is made on the same items. Evaluation must run on
other items (`egrm eval` on the test split): the policy is never scored on what it was fitted on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import date
from pathlib import Path
from typing import Any

from egrm.evals.frontier import signals
from egrm.evals.harness import ItemOutcome
from egrm.pipeline.routing import RoutingPolicy

MIN_CONSENSUS = (0.6, 0.8, 1.0)
MIN_EXACT: tuple[float | None, ...] = (None, 0.5, 0.6, 0.7, 0.8, 0.9)
MIN_ALL = (0.8, 0.9, 1.0)


def binomial_cdf(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def error_upper_bound(errors: int, n: int, alpha: float) -> float:
    """One-sided Clopper-Pearson upper bound: the largest error rate under which seeing at most
    `errors` wrong in n has probability at least alpha (bisection on the binomial CDF)."""
    if n == 0:
        return 1.0
    if errors >= n:
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
    policy: RoutingPolicy
    short: int
    errors: int
    upper: float  # the error bound at the split confidence


def try_policy(policy: RoutingPolicy, outcomes: Sequence[ItemOutcome], alpha: float) -> Tried:
    short = errors = 0
    for o in outcomes:
        s = signals(o)
        if policy.short(s):
            short += 1
            answer = o.estimates["all" if policy.wants_extra(s.consensus) else "sampled"].answer
            errors += answer != o.item.gold
    return Tried(policy, short, errors, error_upper_bound(errors, short, alpha))


def choose(
    outcomes: Sequence[ItemOutcome], error: float, confidence: float, extra: int
) -> tuple[RoutingPolicy | None, list[Tried]]:
    """The candidate with the most items sent short whose error bound is under `error` (ties: the
    fewer extra samples, then the simpler); None when no candidate qualifies."""
    tried_policies = candidates(extra)
    alpha = (1 - confidence) / len(tried_policies)
    tried = [try_policy(p, outcomes, alpha) for p in tried_policies]
    ok = [t for t in tried if t.short and t.upper <= error]
    if not ok:
        return None, tried
    best = max(ok, key=lambda t: (t.short, -t.policy.extra, -(t.policy.min_exact or 0), -t.policy.require_agree))
    return best.policy, tried


def describe(
    policy: RoutingPolicy, tried: Sequence[Tried], n: int, error: float, confidence: float, source: dict[str, Any]
) -> RoutingPolicy:
    """The policy with where it came from, for the file and for whoever reads it."""
    (mine,) = [t for t in tried if t.policy == policy]
    record = {
        **source,
        "n": n,
        "short": mine.short,
        "short_path_rate": round(mine.short / n, 4),
        "short_path_errors": mine.errors,
        "error_bound": error,
        "error_upper": round(mine.upper, 4),
        "confidence": confidence,
        "candidates": len(tried),
        "date": date.today().isoformat(),
    }
    return replace(policy, name=f"calibrated on {source.get('data', 'data')}", calibration=record)


def main(
    data: str,
    split: str,
    limit: int | None,
    error: float,
    confidence: float,
    extra: int,
    seed: int,
    out: Path | None,
) -> dict[str, Any]:
    """Run the calibration items down the short path, choose, and write the policy (beside the
    judge unless `out` says where). Returns what was chosen, and the best candidates tried."""
    import asyncio
    import sys

    from tqdm import tqdm

    from egrm.config import Settings
    from egrm.evals.data import load_dataset
    from egrm.evals.harness import EvalConfig, evaluate
    from egrm.evals.runner import take
    from egrm.factory import POLICY_FILE, adapter_path, model_path, pipeline_from

    settings = Settings(routing_policy="none")  # the signals of the judge itself, not of an old policy
    items = take(load_dataset(data, split), limit)
    config = EvalConfig(modes=("short",), extra=extra, seed=seed)

    async def run() -> list[ItemOutcome]:
        async with pipeline_from(settings) as pipeline:
            with tqdm(total=len(items), desc="calibrate", file=sys.stderr, unit="item") as bar:
                return await evaluate(pipeline, items, config, progress=lambda: bar.update(1))

    outcomes = asyncio.run(run())
    policy, tried = choose(outcomes, error, confidence, extra)
    best = sorted(tried, key=lambda t: (t.upper > error, -t.short))[:5]
    report: dict[str, Any] = {
        "data": data,
        "split": split,
        "n": len(outcomes),
        "error_bound": error,
        "confidence": confidence,
        "candidates": len(tried),
        "best_tried": [
            {"policy": t.policy.describe(), "short": t.short, "errors": t.errors, "error_upper": round(t.upper, 4)}
            for t in best
        ],
    }
    if policy is None:
        report["policy"] = None
        return report
    chosen = describe(policy, tried, len(outcomes), error, confidence, {"data": data, "split": split})
    if out is None:
        judge = adapter_path(settings) or model_path(settings)
        out = (judge if judge.is_dir() else judge.parent) / POLICY_FILE
    chosen.save(out)
    report |= {"policy": chosen.describe(), "written": str(out), **chosen.calibration}
    return report
