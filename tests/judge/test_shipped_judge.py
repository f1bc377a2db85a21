"""The shipped judge, served as `make serve` serves it: it computes easy items, however they are
asked, and the verifier holds the response against its result."""

from __future__ import annotations

import asyncio
import re

import pytest

from egrm.evals.data import builtin_arith, question_of
from egrm.pipeline.service import RewardPipeline
from egrm.pipeline.types import JudgeOptions, PathMode, VerdictBy
from egrm.scorer.heuristic import HeuristicScorer

pytestmark = pytest.mark.slow

# Held-out items (the test split shares no question with training), right and wrong alike, asked
# the way people write (words, word problems, "Compute ...", LaTeX).
EASY = [item for item in builtin_arith("test", mixed_forms=True) if item.difficulty == "easy"][:12]


def greedy(path: PathMode) -> JudgeOptions:
    return JudgeOptions(temperatures=[0.0], top_p=1.0, tau=0.8, path=path, template="verdict", return_samples=True)


def test_the_judge_states_the_computation_then_its_result_and_is_held_to_it(engine, checker):
    pipeline = RewardPipeline(engine, HeuristicScorer(), checker)
    results = asyncio.run(pipeline.score([i.judge_item() for i in EASY], greedy(PathMode.SHORT)))
    texts = [r.samples[0].text for r in results]
    # Its own answer, before it sees the response: the question as it computes it, and a result.
    for text, item in zip(texts, EASY, strict=True):
        q = question_of(item)
        assert re.fullmatch(rf"{q.a}[-+*]{q.b}=[-+*=\d]*=?\d+", text), (item.prompt, text)
    right = [r.votes == {str(i.truth): 1} for r, i in zip(results, EASY, strict=True)]
    assert sum(right) >= 6, texts  # greedy, it computes about half of the easy items in one go (7 of 12)
    # The verifier compared the response's number with that result: the verdict follows it.
    for r, item, ok in zip(results, EASY, right, strict=True):
        (j,) = r.judgements
        assert j.by is VerdictBy.EQUIVALENCE and j.response_answer == str(item.proposed)
        assert r.answer == ("Yes" if j.judge_answer == j.response_answer else "No")
        if ok:
            assert r.answer == item.gold


def test_the_long_path_reasons_in_steps_and_its_result_decides(engine, checker):
    pipeline = RewardPipeline(engine, HeuristicScorer(), checker)
    item = EASY[1]
    (result,) = asyncio.run(pipeline.score([item.judge_item()], greedy(PathMode.LONG)))
    (candidate,) = result.candidates
    q = question_of(item)
    steps = candidate.reasoning.partition("step by step.\n")[2]
    assert steps.startswith(f"{q.a}{q.op}{q.b}="), candidate.reasoning  # the working, as trained
    last = re.findall(r"\d+", steps)[-1]
    assert candidate.answer == last == result.judgements[0].judge_answer
    assert result.answer == ("Yes" if last == str(item.proposed) else "No")
