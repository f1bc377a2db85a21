"""Turn item outcomes into the figures `egrm eval` prints: accuracy, routing, latency, tokens."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from egrm.evals.data import LabelledItem
from egrm.evals.frontier import frontier
from egrm.evals.harness import ESTIMATORS, MODES, Estimate, EvalConfig, ItemOutcome, ModeRun
from egrm.pipeline.routing import describe_routing
from egrm.pipeline.types import Route

NAMES = {"routed": "routed", "short": "always_short", "long": "always_long", "early": "always_long_early_stop"}
TAU_GRID = (0.6, 0.7, 0.8, 0.9, 1.0)


def _rate(hits: Sequence[bool]) -> float | None:
    return round(sum(hits) / len(hits), 4) if hits else None


def _latency(values: Sequence[float]) -> dict[str, float]:
    return {
        "mean": round(float(np.mean(values)), 1),
        "p50": round(float(np.percentile(values, 50)), 1),
        "p99": round(float(np.percentile(values, 99)), 1),
    }


def _modes(outcomes: Sequence[ItemOutcome]) -> list[str]:
    """The modes that ran, in the fixed order routed, short, long."""
    return [m for m in MODES if outcomes and m in outcomes[0].runs]


def routing(outcomes: Sequence[ItemOutcome], tau: float) -> dict[str, Any]:
    """Accuracy per mode; how often the short path answers and how often it is then right."""
    out: dict[str, Any] = {"n": len(outcomes)}
    modes = _modes(outcomes)
    for mode in modes:
        out[f"accuracy_{NAMES[mode]}"] = _rate([o.correct(mode) for o in outcomes])
    if "routed" in modes:
        short = [o.runs["routed"].route is Route.SHORT for o in outcomes]
    else:  # a short-only sweep: where routing would send each item, from its consensus
        short = [o.consensus >= tau for o in outcomes]
    went_short = [o for o, s in zip(outcomes, short, strict=True) if s]
    out["short_path_rate"] = _rate(short)
    out["short_path_accuracy"] = _rate([o.majority == o.item.gold for o in went_short])
    if "routed" in modes:
        out["long_path_accuracy"] = _rate([o.correct("routed") for o, s in zip(outcomes, short, strict=True) if not s])
    out["mean_consensus"] = round(statistics.fmean(o.consensus for o in outcomes), 4) if outcomes else None
    return out


def summarise(outcomes: Sequence[ItemOutcome], config: EvalConfig) -> dict[str, Any]:
    temperatures, top_p = config.sampling()
    report: dict[str, Any] = {
        "m": config.m,
        "tau": config.tau,
        "strategy": config.strategy,
        "temperatures": temperatures,
        "top_p": top_p,
        **routing(outcomes, config.tau),
    }
    modes = _modes(outcomes)
    if {"routed", "short", "long"} <= set(modes):
        # Seeded sampling makes a routed item's answer its forced mode's (routed long: the long path
        # as served, with early stop where the early mode ran); tau sweeps rely on it.
        report["routed_matches_forced"] = _rate([_matches_forced(o.runs["routed"], o) for o in outcomes])
    if "routed" in modes and "long" in modes:
        report["latency_ratio_routed_vs_long"] = round(
            statistics.fmean(o.runs["routed"].latency_ms for o in outcomes)
            / statistics.fmean(o.runs["long"].latency_ms for o in outcomes),
            4,
        )
    report["latency_ms"] = {NAMES[m]: _latency([o.runs[m].latency_ms for o in outcomes]) for m in modes}
    if "early" in modes:  # how often the first candidates decided alone
        report["early_stop_rate"] = _rate([len(o.runs["early"].candidates) < config.m for o in outcomes])
    report["tokens_per_item"] = {
        NAMES[m]: {
            "prompt": round(statistics.fmean(o.runs[m].prompt_tokens for o in outcomes), 1),
            "completion": round(statistics.fmean(o.runs[m].completion_tokens for o in outcomes), 1),
        }
        for m in modes
    }
    report["reward_auc"] = {NAMES[m]: auc([o.runs[m].reward for o in outcomes], _gold(outcomes)) for m in modes}
    report["score_auc"] = {NAMES[m]: auc([_score(o.runs[m].reward) for o in outcomes], _gold(outcomes)) for m in modes}
    report["verdict_by"] = {
        NAMES[m]: dict(Counter(o.runs[m].verdict_by for o in outcomes if o.runs[m].verdict_by)) for m in modes
    }
    for field, key in (("difficulty", "by_difficulty"), ("form", "by_question_form")):
        groups = sorted({_group(o.item, field) for o in outcomes} - {""})
        if groups:
            by = {g: [o for o in outcomes if _group(o.item, field) == g] for g in groups}
            report[key] = {g: routing(group, config.tau) for g, group in by.items()}
    report["calibration"] = calibration(outcomes, config.consensus)
    if "short" in modes and "long" in modes:
        report["tau_curve"] = tau_curve(outcomes, config.consensus)
    report["consensus_estimators"] = {name: estimator(outcomes, config.tau, name, modes) for name in ESTIMATORS}
    report["routing"] = describe_routing(config.policy, config.tau)
    if "short" in modes and "long" in modes:
        report["frontier"] = frontier(outcomes, config.m, config.extra, config.policy)
    if "short" in modes:
        report["short_path_slips"] = slips(outcomes)
    if "long" in modes:
        report["diversity"] = diversity(outcomes)
    return report


def slips(outcomes: Sequence[ItemOutcome]) -> dict[str, Any]:
    """The short path's confident mistakes: items whose M samples were unanimous and whose short
    answer was wrong, by difficulty, by what went wrong (a right response called wrong, or a wrong
    one called right: then how the near miss differs), and by the question's form."""
    unanimous = [o for o in outcomes if o.estimates["sampled"].consensus >= 1.0]
    wrong = [o for o in unanimous if o.estimates["sampled"].answer != o.item.gold]

    def miss(o: ItemOutcome) -> str:
        if o.item.gold == "Yes":
            return "right response called wrong"
        if o.item.truth is None or o.item.proposed is None:
            return "wrong response called right"
        gap = abs(o.item.proposed - o.item.truth)
        kind = {1: "off by 1", 10: "off by 10", 100: "off by 100"}.get(gap, "digits swapped")
        return f"wrong response called right ({kind})"

    return {
        "unanimous": len(unanimous),
        "wrong": len(wrong),
        "by_difficulty": dict(Counter(o.item.difficulty for o in wrong)),
        "by_kind": dict(Counter(miss(o) for o in wrong)),
        "by_question_form": dict(Counter(_group(o.item, "form") or "-" for o in wrong)),
    }


def _group(item: LabelledItem, field: str) -> str:
    """An item's group: its difficulty, or whether its question form was seen in training."""
    return item.difficulty if field == "difficulty" else item.form.partition("/")[0]


def _gold(outcomes: Sequence[ItemOutcome]) -> list[bool]:
    return [o.item.gold == "Yes" for o in outcomes]


def _score(reward: float | None) -> float | None:
    """The `score` template's 1..10 for a reward (the same judgement on a coarser scale)."""
    return None if reward is None else float(1 + int(9 * reward + 0.5))


def auc(values: Sequence[float | None], positive: Sequence[bool]) -> float | None:
    """Area under the ROC curve: the chance a right response outscores a wrong one (ties: half)."""
    pos = [v for v, p in zip(values, positive, strict=True) if p and v is not None]
    neg = [v for v, p in zip(values, positive, strict=True) if not p and v is not None]
    if not pos or not neg:
        return None
    wins = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in pos for b in neg)
    return round(wins / (len(pos) * len(neg)), 4)


def _matches_forced(routed: ModeRun, outcome: ItemOutcome) -> bool:
    if routed.route is None:
        return False
    forced = outcome.long_mode if routed.route is Route.LONG else routed.route.value
    return routed.answer == outcome.runs[forced].answer


def _level(estimate: Estimate, name: str) -> float:
    """Calibration bins: the sampled consensus has M + 1 levels; the exact one is binned by 0.1."""
    if name == "exact":
        return round(min(0.9, int(estimate.consensus * 10) / 10), 1)
    return round(estimate.consensus, 4)


def calibration(outcomes: Sequence[ItemOutcome], name: str = "sampled") -> list[dict[str, Any]]:
    """For each consensus level: how many items, and how often their short-path answer is right."""
    levels = sorted({_level(o.estimates[name], name) for o in outcomes})
    rows = []
    for level in levels:
        group = [o for o in outcomes if _level(o.estimates[name], name) == level]
        right = [o.estimates[name].answer == o.item.gold for o in group]
        rows.append({"consensus": level, "n": len(group), "accuracy": _rate(right)})
    return rows


def _short(outcome: ItemOutcome, name: str, tau: float) -> bool:
    """Whether the estimator named routes the item to the short path at tau."""
    return outcome.estimates[name].consensus >= tau


def _routed_right(outcome: ItemOutcome, name: str, tau: float) -> bool:
    """Whether routing by the estimator at tau answers right: its short answer, or the long path's."""
    if _short(outcome, name, tau):
        return outcome.estimates[name].answer == outcome.item.gold
    return outcome.correct(outcome.long_mode)


def tau_curve(outcomes: Sequence[ItemOutcome], name: str = "sampled") -> list[dict[str, Any]]:
    """Routing at other thresholds, without running again: the route is a function of consensus,
    and seeded samples make each route's answer the one its forced mode gave."""
    rows = []
    long_latency = statistics.fmean(o.runs["long"].latency_ms for o in outcomes)
    for tau in TAU_GRID:
        short = [_short(o, name, tau) for o in outcomes]
        routed = [_routed_right(o, name, tau) for o in outcomes]
        # The forced short run also drew adaptive M's extra samples (timed apart): not the threshold's cost.
        latency = [
            o.runs["short"].base_ms if s else o.runs[o.long_mode].latency_ms
            for o, s in zip(outcomes, short, strict=True)
        ]
        rows.append(
            {
                "tau": tau,
                "short_path_rate": _rate(short),
                "accuracy_routed": _rate(routed),
                "latency_ratio_routed_vs_long": round(statistics.fmean(latency) / long_latency, 4),
            }
        )
    return rows


def estimator(outcomes: Sequence[ItemOutcome], tau: float, name: str, modes: Sequence[str]) -> dict[str, Any]:
    """One consensus estimator side by side with the other, on the same samples: where it would
    route at tau, how right its short path would be, its calibration and its tau curve."""
    short = [o for o in outcomes if _short(o, name, tau)]
    out: dict[str, Any] = {
        "short_path_rate": _rate([_short(o, name, tau) for o in outcomes]),
        "short_path_accuracy": _rate([o.estimates[name].answer == o.item.gold for o in short]),
        "accuracy_short_answer": _rate([o.estimates[name].answer == o.item.gold for o in outcomes]),
        "mean_consensus": round(statistics.fmean(o.estimates[name].consensus for o in outcomes), 4),
        "calibration": calibration(outcomes, name),
    }
    if "short" in modes and "long" in modes:
        out["tau_curve"] = tau_curve(outcomes, name)
        out["accuracy_routed"] = _rate([_routed_right(o, name, tau) for o in outcomes])
    return out


def self_bleu(texts: Sequence[str]) -> float | None:
    """Mean BLEU of each text against the others (1 = identical candidates, 0 = nothing shared)."""
    from sacrebleu.metrics import BLEU

    if len(texts) < 2:
        return None
    bleu = BLEU(effective_order=True)
    scores = [bleu.sentence_score(t, [*texts[:i], *texts[i + 1 :]]).score for i, t in enumerate(texts)]
    return statistics.fmean(scores) / 100


def diversity(outcomes: Sequence[ItemOutcome]) -> dict[str, Any]:
    """Self-BLEU of each item's long-path candidates, and its correlation with consensus (the
    method reports that diverse samples go with low consensus: a negative correlation)."""
    pairs = [(o.consensus, self_bleu(o.runs["long"].candidates)) for o in outcomes]
    known = [(c, b) for c, b in pairs if b is not None]
    out: dict[str, Any] = {"self_bleu": round(statistics.fmean(b for _, b in known), 4) if known else None}
    if len(known) > 2 and len({c for c, _ in known}) > 1 and len({b for _, b in known}) > 1:
        out["corr_diversity_vs_consensus"] = round(
            statistics.correlation([c for c, _ in known], [1 - b for _, b in known]), 4
        )
    return out
