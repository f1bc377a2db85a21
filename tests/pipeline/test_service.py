"""The pipeline end to end on the real model, without HTTP."""

import asyncio
import time

import pytest

from app.pipeline.service import RewardPipeline
from app.pipeline.templates import get_template
from app.pipeline.types import JudgeItem, JudgeOptions, PathMode, Route
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
    cue, final = engine.count_tokens(t.reasoning_cue), engine.count_tokens(t.final_cue)
    computed = result.usage.prompt_tokens - result.usage.cached_prompt_tokens
    # One prefill, then per branch only its pending token and each cue: re-prefilling would add 5x the prefix.
    assert prefix_tokens <= computed <= prefix_tokens + 5 * (1 + cue) + 5 * (1 + final)
    assert result.route is Route.LONG and len(result.candidates) == 5
    assert all(c.reasoning.startswith(("Yes", "No")) and t.reasoning_cue in c.reasoning for c in result.candidates)
    assert result.answer == max(result.candidates, key=lambda c: c.score).answer
    assert not result.degraded


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
