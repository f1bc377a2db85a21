"""The pipeline end to end on the real model, without HTTP."""

import asyncio
import time

import pytest

from app.engines.base import Branch, FinishReason
from app.pipeline.longpath import final_text
from app.pipeline.service import RewardPipeline, exact_probability
from app.pipeline.templates import get_template
from app.pipeline.types import ConsensusMode, JudgeItem, JudgeOptions, PathMode, Route
from app.scorer.heuristic import HeuristicScorer

pytestmark = pytest.mark.slow

ITEM = JudgeItem(prompt="What is 12 + 30?", response="42")


def options(**kw) -> JudgeOptions:
    base = dict(
        temperatures=[0.6, 0.7, 0.8, 0.9, 1.0],
        top_p=0.95,
        tau=0.8,
        path=PathMode.AUTO,
        template="verdict",
        seed=3,
        long_max_tokens=24,
    )
    return JudgeOptions(**{**base, **kw})


class BrokenScorer(HeuristicScorer):
    """A scorer whose backend fails: the long path must degrade, not error."""

    async def score(self, candidates):
        raise ConnectionError("scorer unreachable")


def test_long_path_never_prefills_the_prefix_again(engine):
    result = asyncio.run(RewardPipeline(engine, HeuristicScorer()).score_item(ITEM, options(path=PathMode.LONG)))
    t = get_template("verdict")
    prefix_tokens = engine.count_tokens(engine.render_chat(t.messages(ITEM)))
    cue, final = engine.count_tokens(t.reasoning_cue), engine.count_tokens(final_text(engine, t, ITEM))
    computed = result.usage.prompt_tokens - result.usage.cached_prompt_tokens
    # One prefill, then per branch only its pending token, the cue and the follow-up turn: re-prefilling
    # would add 5x the prefix.
    assert prefix_tokens <= computed <= prefix_tokens + 5 * (1 + cue) + 5 * (1 + final)
    assert result.route is Route.LONG and len(result.candidates) == 5
    assert all(t.reasoning_cue in c.reasoning and c.answer in ("Yes", "No") for c in result.candidates)
    assert result.answer == max(result.candidates, key=lambda c: c.score).answer
    assert not result.degraded


def test_solve_first_votes_on_own_answers_then_reads_the_verdict(engine):
    pipeline = RewardPipeline(engine, HeuristicScorer())
    result = asyncio.run(pipeline.score_item(ITEM, options(path=PathMode.SHORT, return_samples=True)))
    t = get_template("verdict")
    assert [s.vote for s in result.samples] == [t.vote(s.text) for s in result.samples]
    assert sum(result.votes.values()) == sum(s.vote is not None for s in result.samples)
    # The verdict is read after the majority answer, in a follow-up turn: one more branch's tokens.
    assert result.answer in ("Yes", "No") and result.answer == result.majority_answer
    assert result.usage.completion_tokens == sum(engine.count_tokens(s.text) for s in result.samples) + 1


def test_exact_consensus_routes_on_the_greedy_answers_probability(engine):
    pipeline = RewardPipeline(engine, HeuristicScorer())
    sampled = asyncio.run(pipeline.score_item(ITEM, options(path=PathMode.SHORT, return_samples=True)))
    exact = asyncio.run(
        pipeline.score_item(ITEM, options(path=PathMode.SHORT, return_samples=True, consensus=ConsensusMode.EXACT))
    )
    # The same seeded samples and votes, plus one greedy branch whose probability routes the item.
    assert exact.votes == sampled.votes and sampled.exact is None and exact.exact is not None
    assert 0 < exact.exact.probability <= 1 and exact.consensus == exact.exact.probability
    assert exact.answer == exact.exact.answer and exact.answer in ("Yes", "No")
    # with_exact measures it, and both short answers, while the vote still routes (evaluation)
    both = asyncio.run(pipeline.score_item(ITEM, options(path=PathMode.SHORT, return_samples=True, with_exact=True)))
    assert both.consensus == sampled.consensus and both.exact == exact.exact
    assert both.majority_answer == sampled.answer == both.answer
    # On the long route the leader is left to the long path; the greedy branch still gives its answer.
    long = asyncio.run(pipeline.score_item(ITEM, options(path=PathMode.LONG, return_samples=True, with_exact=True)))
    assert long.route is Route.LONG and long.majority_answer is None and long.exact == exact.exact
    sure = asyncio.run(pipeline.score_item(ITEM, options(tau=0.0, consensus=ConsensusMode.EXACT)))
    unsure = asyncio.run(pipeline.score_item(ITEM, options(tau=1.0, consensus=ConsensusMode.EXACT)))
    assert sure.route is Route.SHORT and (unsure.route is Route.LONG) == (exact.exact.probability < 1.0)


def test_exact_probability_needs_logprobs():
    greedy = Branch("85", [1, 2, 3], FinishReason.STOP, 10, 0, logprobs=[-0.1, -0.2, -0.3])
    assert exact_probability(greedy) == pytest.approx(0.5488, abs=1e-4)
    with pytest.raises(ValueError, match="log-probabilities"):
        exact_probability(Branch("85", [1, 2], FinishReason.STOP, 10, 0))


def test_scorer_failure_degrades_to_the_candidates_vote(engine):
    pipeline = RewardPipeline(engine, BrokenScorer())
    result = asyncio.run(pipeline.score_item(ITEM, options(path=PathMode.LONG)))
    answers = [c.answer for c in result.candidates]
    assert result.degraded and result.error is None
    assert result.answer == max(set(answers), key=answers.count) and result.reward in (0.0, 1.0)


def test_batch_keeps_order_and_isolates_a_bad_item(engine):
    items = [ITEM, JudgeItem(prompt="x " * 9000, response="y"), JudgeItem(prompt="Is water wet?", response="Yes")]
    results = asyncio.run(RewardPipeline(engine, HeuristicScorer()).score(items, options(path=PathMode.SHORT)))
    assert [r.error is None for r in results] == [True, False, True]
    assert results[1].reward is None and "context" in results[1].error


def test_a_refused_item_cancels_its_siblings(loaded_fp32):
    from app.engines.base import EngineBusyError
    from app.engines.embedded.engine import EmbeddedEngine
    from tests.engines.test_batching import hold_model_thread

    engine = EmbeddedEngine(loaded_fp32, max_queue=1)
    try:
        release = hold_model_thread(engine)
        pipeline = RewardPipeline(engine, HeuristicScorer())
        items = [ITEM, JudgeItem(prompt="Is ice cold?", response="Yes")]

        async def refused_then_idle() -> int:
            with pytest.raises(EngineBusyError):  # the first item took the one queue slot
                await pipeline.score(items, options(path=PathMode.SHORT))
            release.set()  # the loop keeps running, as in a server: the first item could still run
            deadline = time.monotonic() + 10
            while engine.stats().queue_depth and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            await asyncio.to_thread(engine.run_on_model_thread, lambda: None)
            return engine.stats().batches

        assert asyncio.run(refused_then_idle()) == 0  # its queued job was dropped, not run
    finally:
        asyncio.run(engine.close())
