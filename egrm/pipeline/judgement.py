"""From the judge's answers to a judgement: is the response right, and with what probability.

Where the judge's answer and the response's can both be read as math, the verifier decides
(`equivalence`): the response is right when it equals the judge's answer, and p is the share of
the judge's answers (its samples; on the long path, its candidates weighted by the scorer) that
equal the response's. Where either cannot, the judge's Yes/No follow-up decides (`judge`), and
p is its probability of Yes. Either way, how the response is worded does not enter.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from egrm.engines.base import Branch
from egrm.pipeline.templates import JUDGE
from egrm.pipeline.types import Judgement, VerdictBy
from egrm.pipeline.verifier import Comparison


def vote_weights(scores: Sequence[float]) -> list[float]:
    """Each candidate's weight in the long path's vote: its scorer score, floored at 0 (equal
    weights when no score is above 0)."""
    return [max(s, 0.0) for s in scores] if any(s > 0 for s in scores) else [1.0] * len(scores)


def weighted_vote(keys: Sequence[str | None], weights: Sequence[float]) -> str | None:
    """The class of answers with the most weight (ties: the first seen); None when none was given."""
    totals: dict[str, float] = defaultdict(float)
    for key, weight in zip(keys, weights, strict=True):
        if key is not None:
            totals[key] += weight
    return max(totals, key=lambda k: totals[k]) if totals else None


def share(keys: Sequence[str | None], weights: Sequence[float], key: str | None) -> float:
    """The weight on answers of class `key`, over the weight of every answer given."""
    given = [(k, w) for k, w in zip(keys, weights, strict=True) if k is not None]
    total = sum(w for _, w in given)
    if key is None or total <= 0:
        return 0.0
    return sum(w for k, w in given if k == key) / total


def by_equivalence(
    comparison: Comparison, keys: Sequence[str | None], weights: Sequence[float], judge_answer: str | None
) -> Judgement | None:
    """The response (the comparison's first) held against the judge's answer; None when either
    side is not checkable."""
    if not comparison.checkable(judge_answer, 0):
        return None
    response_key = comparison.response_keys[0]
    return Judgement(
        p=share(keys, weights, response_key),
        right=response_key == judge_answer,
        by=VerdictBy.EQUIVALENCE,
        judge_answer=judge_answer,
        response_answer=comparison.response_answers[0],
    )


def by_exact(comparison: Comparison, keys: Sequence[str | None], greedy: str | None, q: float) -> Judgement | None:
    """The exact estimator's judgement: its greedy answer decides. p is that answer's probability q
    when the response equals it; otherwise the samples' share on the response, which cannot
    exceed the 1 - q left over."""
    judgement = by_equivalence(comparison, keys, [1.0] * len(keys), greedy)
    if judgement is None:
        return None
    p = q if judgement.right else min(judgement.p, 1.0 - q)
    return Judgement(p, judgement.right, judgement.by, greedy, judgement.response_answer)


def p_yes(verdict: Branch) -> float:
    """P(Yes) from a Yes/No branch: constrained, its log-prob is renormalised over the two, so the
    other answer has the rest. A branch that says neither counts as no."""
    said = JUDGE.verdict_of(verdict.text)
    if said is None:
        return 0.0
    chosen = math.exp(sum(verdict.logprobs)) if verdict.logprobs else 1.0
    return chosen if said == "Yes" else 1.0 - chosen


def by_verdicts(
    verdicts: Sequence[Branch], weights: Sequence[float], comparison: Comparison, judge_answer: str | None
) -> Judgement:
    """The judge's Yes/No follow-ups decide: p is their weighted P(Yes)."""
    total = sum(weights)
    p = sum(w * p_yes(v) for v, w in zip(verdicts, weights, strict=True)) / total if total > 0 else 0.0
    return Judgement(p, p >= 0.5, VerdictBy.JUDGE, judge_answer, comparison.response_answers[0])
