"""The shipped judge, served as `make serve` serves it: it computes easy items and judges by its result."""

from __future__ import annotations

import asyncio
import re

import pytest

from app.evals.data import builtin_arith, question_of
from app.judge.targets import proposed_of, verdict
from app.pipeline.service import RewardPipeline
from app.pipeline.types import JudgeOptions, PathMode
from app.scorer.heuristic import HeuristicScorer

pytestmark = pytest.mark.slow

# Held-out items (the test split shares no question with training), right and wrong alike.
EASY = [item for item in builtin_arith("test") if item.difficulty == "easy"][:8]


def greedy(path: PathMode) -> JudgeOptions:
    return JudgeOptions(temperatures=[0.0], top_p=1.0, tau=0.8, path=path, template="verdict", return_samples=True)


def test_the_judge_solves_easy_items_blind_and_judges_by_its_result(engine):
    pipeline = RewardPipeline(engine, HeuristicScorer())
    results = asyncio.run(pipeline.score([i.judge_item() for i in EASY], greedy(PathMode.SHORT)))
    own = [r.samples[0].vote for r in results]
    right = [o == str(question_of(i).value) for o, i in zip(own, EASY, strict=True)]
    # Its own result, before it sees the response: a number, right on some easy items (greedy, it
    # gets 2 of these 8 right: a 135M model's one-shot arithmetic; the untuned one writes prose).
    assert all(o is not None and o.isdigit() for o in own) and sum(right) >= 2, own
    # Then it judges the response by that result: Yes exactly when the response's number is it.
    assert [r.answer for r in results] == [verdict(int(o), proposed_of(i)) for o, i in zip(own, EASY, strict=True)]
    # So where it computed right, its verdict is the gold one, on right and wrong responses alike.
    assert all(r.answer == i.gold for r, i, ok in zip(results, EASY, right, strict=True) if ok)


def test_the_long_path_reasons_in_steps_and_ends_with_a_verdict(engine):
    pipeline = RewardPipeline(engine, HeuristicScorer())
    item = EASY[1]
    (result,) = asyncio.run(pipeline.score([item.judge_item()], greedy(PathMode.LONG)))
    (candidate,) = result.candidates
    q = question_of(item)
    steps = candidate.reasoning.partition("step by step.\n")[2]
    assert steps.startswith(f"{q.a}{q.op}{q.b}="), candidate.reasoning  # the working, as trained
    last = int(re.findall(r"\d+", steps)[-1])
    assert candidate.answer == result.answer == verdict(last, proposed_of(item))  # judged by where it got
