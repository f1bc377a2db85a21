"""RLHF groups on the real model: G responses to one question, judged against one piece of work."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from egrm.pipeline.service import RewardPipeline
from egrm.pipeline.sharing import SharingLimits
from egrm.pipeline.types import ItemResult, JudgeItem, JudgeOptions, PathMode, Route, Shared
from egrm.scorer.heuristic import HeuristicScorer

pytestmark = pytest.mark.slow

QUESTION = "What is 23 + 19?"
# Right and wrong answers, each written several ways; two the verifier cannot read (a Roman numeral).
GROUP = ["42", "The answer is 42.", "$\\boxed{42}$", "41", "**41**", "23 + 19 = 42", "XLII", "XLII"]
ITEMS = [JudgeItem(prompt=QUESTION, response=r) for r in GROUP]


def options(**kw) -> JudgeOptions:
    base = dict(temperatures=[0.6, 0.7, 0.8, 0.9, 1.0], top_p=0.95, tau=0.8, path=PathMode.AUTO, template="verdict")
    return JudgeOptions(**{**base, "long_max_tokens": 48, **kw})


def sharing(engine, checker) -> RewardPipeline:
    return RewardPipeline(engine, HeuristicScorer(), checker, sharing=SharingLimits())


def rewards_by_answer(results: list[ItemResult]) -> dict[str, set[float]]:
    """The rewards each answer got: equal answers (as the verifier reads them), or equal texts
    where it reads none."""
    out: dict[str, set[float]] = {}
    for response, r in zip(GROUP, results, strict=True):
        (j,) = r.judgements
        out.setdefault(j.response_answer or response, set()).add(r.reward)
    return out


def completion_tokens(results: list[ItemResult]) -> int:
    return sum(r.usage.completion_tokens for r in results)


@pytest.mark.parametrize("path", [PathMode.SHORT, PathMode.LONG])
def test_a_group_in_one_request_is_judged_once_with_one_reward_per_answer(engine, checker, path):
    results = asyncio.run(sharing(engine, checker).score(ITEMS, options(path=path)))  # no seed
    assert [r.shared for r in results] == [None] + [Shared.JOINED] * 7
    assert {r.route for r in results} == {Route(path.value)}
    # The same samples, votes and (long path) candidates for every response.
    assert len({str(r.votes) for r in results}) == 1
    assert len({str(r.candidates and [(c.reasoning, c.score) for c in r.candidates]) for r in results}) == 1
    by_answer = rewards_by_answer(results)
    assert set(by_answer) == {"42", "41", "XLII"}
    assert all(len(rewards) == 1 for rewards in by_answer.values()), by_answer  # spread 0.000
    # Only the item that computed the work spent tokens on it; the others only on their follow-ups.
    computed, *shared = results
    assert computed.usage.completion_tokens > 0
    assert all(r.usage.completion_tokens == 0 for r, text in zip(shared, GROUP[1:], strict=True) if text != "XLII")


def test_one_query_per_request_arriving_together_shares_the_work_as_one_request_does(engine, checker):
    pipeline = sharing(engine, checker)

    async def one_per_request() -> list[ItemResult]:
        return [r for rs in await asyncio.gather(*(pipeline.score([i], options()) for i in ITEMS)) for r in rs]

    together = asyncio.run(one_per_request())
    assert sorted(r.shared is None for r in together) == [False] * 7 + [True]
    assert all(len(rewards) == 1 for rewards in rewards_by_answer(together).values())
    # Later requests for the same question read the kept work: the same rewards, no model work.
    later = asyncio.run(pipeline.score(ITEMS, options()))
    assert [r.shared for r in later] == [Shared.CACHED] * 8
    assert [r.reward for r in later] == [r.reward for r in together]
    assert completion_tokens(later) == 0
    stats = pipeline.questions.stats()
    assert (stats.misses, stats.entries) == (1, 1) and stats.joins + stats.hits == 15


def test_with_a_seed_sharing_on_and_off_give_the_same_rewards(exact_engine, checker):
    seeded = options(seed=11, return_samples=True)
    on = asyncio.run(sharing(exact_engine, checker).score(ITEMS, seeded))
    off = asyncio.run(RewardPipeline(exact_engine, HeuristicScorer(), checker).score(ITEMS, seeded))
    assert [r.shared for r in off] == [None] * 8
    assert [(r.route, r.votes) for r in on] == [(r.route, r.votes) for r in off]
    assert [[s.text for s in r.samples] for r in on] == [[s.text for s in r.samples] for r in off]
    # Off, the eight questions ran as one batch; on, one question ran alone. Other batch shapes
    # sum in another order (0.7442955 vs 0.7442967 seen on an AVX-512 machine): the rewards that
    # rest on log-probs (scorer weights, P(Yes)) agree to a tolerance, not to the last bit.
    assert [r.reward for r in on] == pytest.approx([r.reward for r in off], abs=1e-4)
    # Off, every response paid for its own samples.
    assert completion_tokens(off) > 4 * completion_tokens(on)


def test_other_options_or_another_question_are_other_work(engine, checker):
    pipeline = sharing(engine, checker)
    asyncio.run(pipeline.score(ITEMS[:1], options(seed=5)))
    (other_seed,) = asyncio.run(pipeline.score(ITEMS[:1], options(seed=6)))
    (other_tau,) = asyncio.run(pipeline.score(ITEMS[:1], options(seed=5, tau=0.6)))
    (other_question,) = asyncio.run(pipeline.score([replace(ITEMS[0], prompt="What is 23 + 18?")], options(seed=5)))
    (same,) = asyncio.run(pipeline.score(ITEMS[:1], options(seed=5, template="score")))  # presentation only
    others = [other_seed.shared, other_tau.shared, other_question.shared]
    assert others == [None, None, None] and same.shared is Shared.CACHED


class ScorerDownOnce(HeuristicScorer):
    def __init__(self) -> None:
        self.calls = 0

    async def score(self, candidates):
        self.calls += 1
        if self.calls == 1:
            raise ConnectionError("scorer unreachable")
        return await super().score(candidates)


def test_degraded_work_is_not_kept_for_later_requests(engine, checker):
    pipeline = RewardPipeline(engine, ScorerDownOnce(), checker, sharing=SharingLimits())
    (first,) = asyncio.run(pipeline.score(ITEMS[:1], options(path=PathMode.LONG, seed=3)))
    (second,) = asyncio.run(pipeline.score(ITEMS[:1], options(path=PathMode.LONG, seed=3)))
    (third,) = asyncio.run(pipeline.score(ITEMS[:1], options(path=PathMode.LONG, seed=3)))
    assert first.degraded and first.shared is None
    assert not second.degraded and second.shared is None  # judged anew, once the scorer is back
    assert third.shared is Shared.CACHED
