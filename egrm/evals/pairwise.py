"""`egrm eval --template pairwise`: right-against-wrong pairs, each asked in both orders.

Each labelled builtin item gives one pair: its response, and the same text with the other number
in it (the true result where it gave a near miss, a near miss where it gave the true result), so
the two responses differ only in their answer. A judge with a position bias shows it as accuracy
that depends on the order, or as a share of "A" far from one half.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from egrm.evals.data import LabelledItem, near_miss
from egrm.evals.harness import EvalConfig
from egrm.pipeline.service import RewardPipeline
from egrm.pipeline.types import JudgeItem


def swapped_number(text: str, old: int, new: int) -> str:
    """The response with its answer `old` written as `new` (with a thousands separator where it had one)."""
    return text.replace(f"{old:,}", f"{new:,}").replace(str(old), str(new))


def right_and_wrong(item: LabelledItem, rng: random.Random) -> tuple[str, str]:
    """The item's response and its twin with the other answer: (right one, wrong one)."""
    if item.truth is None or item.proposed is None:
        raise ValueError(f"{item.id}: pairs are made from builtin:arith items (they know their numbers)")
    if item.proposed == item.truth:
        return item.response, swapped_number(item.response, item.truth, near_miss(item.truth, rng))
    return swapped_number(item.response, item.proposed, item.truth), item.response


async def evaluate_pairs(
    pipeline: RewardPipeline,
    items: Sequence[LabelledItem],
    config: EvalConfig,
    progress: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """Every pair routed as served, right response first (gold A) and second (gold B)."""
    rng = random.Random(config.seed)
    hits: dict[str, list[bool]] = {"AB": [], "BA": []}
    answers: list[str | None] = []
    rewards: list[float] = []
    for index, item in enumerate(items):
        right, wrong = right_and_wrong(item, rng)
        options = config.options("routed", "pairwise", config.seed + 10_000 * index)
        for order, (a, b), gold in (("AB", (right, wrong), "A"), ("BA", (wrong, right), "B")):
            result = await pipeline.score_item(JudgeItem(item.prompt, a, response_b=b, id=item.id), options)
            hits[order].append(result.answer == gold)
            answers.append(result.answer)
            reward = result.reward or 0.0  # P(A better); for the right response: itself, or 1 - it
            rewards.append(reward if gold == "A" else 1 - reward)
        progress()
    return {
        "template": "pairwise",
        "n_pairs": len(items),
        "accuracy": round(statistics.fmean(hits["AB"] + hits["BA"]), 4),
        "accuracy_right_first": round(statistics.fmean(hits["AB"]), 4),
        "accuracy_right_second": round(statistics.fmean(hits["BA"]), 4),
        "share_answered_A": round(answers.count("A") / len(answers), 4),
        "tie_rate": round(answers.count("tie") / len(answers), 4),
        "mean_reward_of_right": round(statistics.fmean(rewards), 4),
    }
