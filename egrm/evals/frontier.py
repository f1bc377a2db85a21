"""Accuracy against latency for every way to route, from one run of the forced modes.

Seeded samples make a routed item's answer and cost those of the forced mode it would take
(harness.py), and the forced short run draws adaptive M's extra samples on every item (timed
apart), so any routing policy can be replayed offline: the method's threshold at several tau,
the exact estimate, adaptive M, a calibrated policy. A point is a policy: how many items it sends
short, how right it is, its mean latency against reasoning on every item (every candidate to the
end: the baseline) and the completion tokens it draws. A policy's long route is the long path as
served: with early stop where the `early` mode ran.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from egrm.evals.harness import ItemOutcome
from egrm.pipeline.routing import RoutingPolicy, Signals, threshold

TAUS = (0.6, 0.8, 1.0)
EXACT_TAUS = (0.5, 0.7, 0.9)


@dataclass(frozen=True, slots=True)
class Point:
    name: str
    kind: str  # vote, exact, adaptive, calibrated, or always (long / short)
    short_path_rate: float
    short_path_accuracy: float | None
    accuracy_routed: float
    latency_ratio_routed_vs_long: float
    mean_samples: float  # answer-only samples drawn per item
    completion_tokens: float  # per item: what the judge decoded (answer-only samples, reasoning, follow-ups)


def signals(o: ItemOutcome) -> Signals:
    sampled, exact = o.estimates["sampled"], o.estimates["exact"]
    every = o.estimates.get("all")
    return Signals(
        consensus=sampled.consensus,
        exact=exact.consensus,
        agrees=exact.vote is not None and exact.vote == sampled.vote,
        consensus_all=every.consensus if every else None,
    )


@dataclass(frozen=True, slots=True)
class _Routed:
    short: bool
    right: bool
    latency_ms: float
    samples: int
    tokens: int


def _short(o: ItemOutcome, right: bool, m: int) -> _Routed:
    """The item answered by the short path, without adaptive M's extra samples."""
    run = o.runs["short"]
    return _Routed(True, right, run.base_ms, m, run.base_tokens)


def _long(o: ItemOutcome, m: int, mode: str | None = None) -> _Routed:
    """The item answered by the long path (by default, as served: early stop where it ran)."""
    run = o.runs[mode or o.long_mode]
    return _Routed(False, o.correct(mode or o.long_mode), run.latency_ms, m, run.completion_tokens)


def _replay(o: ItemOutcome, policy: RoutingPolicy, m: int, extra: int) -> _Routed:
    """The item as the policy would route it: its answer, latency and samples, from the forced runs."""
    s = signals(o)
    more = policy.wants_extra(s.consensus)
    if policy.short(s):
        routed = _short(o, o.estimates["all" if more else "sampled"].answer == o.item.gold, m)
    else:
        routed = _long(o, m)
    if not more:
        return routed
    short_run = o.runs["short"]  # it drew the extra samples on every item, timed apart
    return replace(
        routed,
        latency_ms=routed.latency_ms + short_run.extra_ms,
        samples=m + extra,
        tokens=routed.tokens + short_run.extra_tokens,
    )


def _point(name: str, kind: str, routed: Sequence[_Routed], long_ms: float) -> Point:
    short = [r for r in routed if r.short]
    return Point(
        name=name,
        kind=kind,
        short_path_rate=round(len(short) / len(routed), 4),
        short_path_accuracy=round(sum(r.right for r in short) / len(short), 4) if short else None,
        accuracy_routed=round(sum(r.right for r in routed) / len(routed), 4),
        latency_ratio_routed_vs_long=round(statistics.fmean(r.latency_ms for r in routed) / long_ms, 4),
        mean_samples=round(statistics.fmean(r.samples for r in routed), 2),
        completion_tokens=round(statistics.fmean(r.tokens for r in routed), 1),
    )


def adaptive_policies(extra: int) -> list[RoutingPolicy]:
    """Adaptive M: a borderline vote (not unanimous, at least min_consensus) draws `extra` more."""
    return [
        RoutingPolicy(f"adaptive {lo:g}->{hi:g}", lo, extra=extra, borderline=1.0, min_consensus_all=hi)
        for lo in (0.6, 0.8)
        for hi in (0.8, 0.9, 1.0)
    ]


def frontier(
    outcomes: Sequence[ItemOutcome], m: int, extra: int, calibrated: RoutingPolicy | None = None
) -> list[dict[str, object]]:
    """Every routing side by side on the same items (they need forced short and long runs)."""
    long_ms = statistics.fmean(o.runs["long"].latency_ms for o in outcomes)
    points = [_point("always long", "always", [_long(o, m, "long") for o in outcomes], long_ms)]
    if "early" in outcomes[0].runs:
        points.append(_point("always long, early stop", "always", [_long(o, m) for o in outcomes], long_ms))
    for tau in TAUS:
        policy = threshold(tau)
        points.append(_point(f"vote, tau={tau:g}", "vote", [_replay(o, policy, m, extra) for o in outcomes], long_ms))
    for tau in EXACT_TAUS:  # the exact estimate alone decides, and its greedy answer is the short one
        routed = []
        for o in outcomes:
            if o.estimates["exact"].consensus >= tau:
                routed.append(_short(o, o.estimates["exact"].answer == o.item.gold, m))
            else:
                routed.append(_long(o, m))
        points.append(_point(f"exact, tau={tau:g}", "exact", routed, long_ms))
    if extra and all("all" in o.estimates for o in outcomes):
        for policy in adaptive_policies(extra):
            points.append(_point(policy.name, "adaptive", [_replay(o, policy, m, extra) for o in outcomes], long_ms))
    if calibrated is not None:
        usable = calibrated.extra in (0, extra)  # its extra samples are the ones this run drew
        if usable:
            routed = [_replay(o, calibrated, m, extra) for o in outcomes]
            points.append(_point(calibrated.describe(), "calibrated", routed, long_ms))
    return [asdict(p) for p in points]
