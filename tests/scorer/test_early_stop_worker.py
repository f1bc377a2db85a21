"""Early stop behind a scorer worker (a real `egrm scorer` process): the worker says in each answer
and at /readyz whether its score is a probability of being right, and the long path stops early
only on such scores. The heuristic's is not one (scored alone, a candidate agrees with itself and
is given half its score), so behind a heuristic worker every candidate reasons to the end."""

import asyncio

import httpx
import pytest

from egrm.pipeline.service import RewardPipeline
from egrm.pipeline.types import JudgeItem, JudgeOptions, PathMode
from egrm.scorer.client import HttpScorer
from loadtest.serverproc import scorer_process
from tests.live import metric

pytestmark = pytest.mark.slow

ITEM = JudgeItem(prompt="What is 12 + 30?", response="42")
M = 3
CANDIDATES = "egrm_scorer_worker_candidates_total"


def options() -> JudgeOptions:
    # A threshold every score passes: a calibrated scorer accepts the first candidate alone.
    return JudgeOptions(
        temperatures=[0.6, 0.8, 1.0],
        top_p=0.95,
        tau=0.8,
        template="verdict",
        path=PathMode.LONG,
        seed=3,
        long_max_tokens=16,
        long_accept=1e-6,
    )


def judged(engine, checker, scorer: HttpScorer):
    async def run():
        try:
            return await RewardPipeline(engine, scorer, checker).score_item(ITEM, options())
        finally:
            await scorer.close()

    return asyncio.run(run())


def test_a_trained_worker_stops_the_long_path_early(engine, checker):
    with scorer_process() as (url, _):
        assert httpx.get(f"{url}/readyz").json() == {"ready": True, "calibrated": True}
        result = judged(engine, checker, HttpScorer(url))
        assert not result.degraded and len(result.candidates) == 1
        assert metric(url, CANDIDATES) == 1  # the window alone was scored


def test_a_heuristic_worker_never_stops_it_early(engine, checker, caplog):
    with scorer_process(args=["--checkpoint", "heuristic"]) as (url, _):
        assert httpx.get(f"{url}/readyz").json() == {"ready": True, "calibrated": False}
        # Before the worker has said what it is, the window is scored apart; its answer says the
        # score is no probability, so it does not decide: every candidate is read and scored.
        scorer = HttpScorer(url)
        result = judged(engine, checker, scorer)
        assert not result.degraded and len(result.candidates) == M
        assert metric(url, CANDIDATES) == 1 + M
        assert not scorer.calibrated and "does not stop early" in caplog.text
        # Once it has said so (here at readiness), no window is scored apart.
        scorer = HttpScorer(url)
        assert asyncio.run(scorer.ready()) and not scorer.calibrated
        assert len(judged(engine, checker, scorer).candidates) == M
        assert metric(url, CANDIDATES) == 1 + 2 * M
