"""The SGLang backend against a LIVE runtime: run by deploy/gpu-check.sh on a GPU machine.

Skipped (with the reason in the summary) unless EGRM_SGLANG_URL names a runtime; EGRM_MODEL must
be the folder of the model it serves (default: the fetched SmolLM2-135M-Instruct).
"""

from __future__ import annotations

import asyncio
import os
import re

import pytest

from egrm.config import Settings
from egrm.engines.base import BranchParams
from egrm.factory import build_engine
from egrm.pipeline.service import RewardPipeline
from egrm.pipeline.templates import JUDGE
from egrm.pipeline.types import JudgeItem, JudgeOptions, PathMode, Route
from egrm.scorer.heuristic import HeuristicScorer

pytestmark = pytest.mark.sglang

ITEM = JudgeItem(prompt="What is 12 + 30?", response="42")
LADDER = [0.6, 0.7, 0.8, 0.9, 1.0]


def run(work):
    async def main():
        engine = build_engine(Settings(engine="sglang", sglang_url=os.environ["EGRM_SGLANG_URL"]))
        try:
            return await work(engine)
        finally:
            await engine.close()

    return asyncio.run(main())


def test_ready_and_names_its_model():
    async def probe(engine):
        return await engine.ready(), engine.model_name

    ready, name = run(probe)
    assert ready and name


def test_five_constrained_branches_share_the_cached_prompt():
    async def sample(engine):
        ids = engine.encode_chat(JUDGE.messages(ITEM))
        params = [BranchParams(temperature=x, top_p=0.95, max_new_tokens=4, allowed=JUDGE.verdicts) for x in LADDER]
        return ids, await engine.sample(ids, params)

    ids, branches = run(sample)
    assert all(re.fullmatch(r" ?(Yes|No)", b.text) for b in branches), [b.text for b in branches]
    assert all(b.prompt_tokens == len(ids) for b in branches)
    # After the warm-up every branch finds (nearly) the whole prompt in the radix cache.
    assert all(len(ids) // 2 < b.cached_prompt_tokens < len(ids) for b in branches[1:])


def test_long_path_continues_branches_from_the_cache():
    options = JudgeOptions(
        temperatures=LADDER, top_p=0.95, tau=0.8, path=PathMode.LONG, template="verdict", long_max_tokens=32
    )

    async def score(engine):
        prompt = len(engine.encode_chat(JUDGE.messages(ITEM)))
        return prompt, await RewardPipeline(engine, HeuristicScorer()).score_item(ITEM, options)

    prompt, result = run(score)
    assert result.route is Route.LONG and result.error is None and len(result.candidates) == 5
    assert result.judgements[0].response_answer == "42" and result.reward is not None
    computed = result.usage.prompt_tokens - result.usage.cached_prompt_tokens
    assert computed < 2 * prompt  # the prefix was prefilled once, not once per branch and stage
