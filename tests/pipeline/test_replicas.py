"""Two replicas' pipelines on the real model and a real Redis: a group split between them is judged
once, and a replica that did not compute the work judges its responses against the stored copy
(its Yes/No follow-ups prefill the stored branches' tokens: no cache of them is held there)."""

from __future__ import annotations

import asyncio

import pytest

from egrm.pipeline.cluster import ClusterLimits
from egrm.pipeline.question import derived_seed, question_key, restored, stored
from egrm.pipeline.service import RewardPipeline
from egrm.pipeline.sharing import SharingLimits
from egrm.pipeline.templates import JUDGE
from egrm.pipeline.types import PathMode, Route, Shared
from egrm.scorer.heuristic import HeuristicScorer
from loadtest.serverproc import redis_server
from tests.pipeline.test_groups import GROUP, ITEMS, options

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("path", [PathMode.SHORT, PathMode.LONG])
def test_a_group_split_between_two_replicas_is_judged_once_with_one_reward_per_answer(exact_engine, checker, path):
    """One engine stands for both replicas' (same weights); each pipeline has its own window and
    its own Redis client, as two processes would."""
    with redis_server() as (url, _):

        async def main():
            a, b = (
                RewardPipeline(
                    exact_engine, HeuristicScorer(), checker, sharing=SharingLimits(), cluster=ClusterLimits(url)
                )
                for _ in range(2)
            )
            opts = options(path=path)  # no seed
            # OpenRLHF-shaped: one query per call, alternating between the replicas, all at once.
            calls = [(a if i % 2 == 0 else b).score([item], opts) for i, item in enumerate(ITEMS)]
            results = [r for (r,) in await asyncio.gather(*calls)]
            stats = a.cluster.stats(), b.cluster.stats()
            await a.close()
            await b.close()
            return results, stats

        results, (sa, sb) = asyncio.run(main())
    assert sa.computed + sb.computed == 1 and sa.local + sb.local == 0
    assert {r.route for r in results} == {Route(path.value)}
    assert len({str(r.votes) for r in results}) == 1
    assert len({str(r.candidates and [(c.reasoning, c.score) for c in r.candidates]) for r in results}) == 1
    # Only the item that computed the work reports it computed and spent its tokens.
    assert sum(r.shared is None for r in results) == 1
    assert all(r.shared in (None, Shared.JOINED, Shared.CACHED) for r in results)
    by_text: dict[str, list[float]] = {}
    for response, r in zip(GROUP, results, strict=True):
        (j,) = r.judgements
        by_text.setdefault(j.response_answer or response, []).append(r.reward)
    assert set(by_text) == {"42", "41", "XLII"}
    for answer, rewards in by_text.items():
        if answer != "XLII":
            assert len(set(rewards)) == 1, by_text  # read off the one stored work: equal to the last bit
    # "XLII" went to both replicas (items 6 and 7): the judge's Yes/No decided it, on one of
    # them by continuing the branches it holds, on the other by prefilling their stored tokens.
    # Different batch shapes: equal to float noise.
    assert rewards_equal(by_text["XLII"])


def rewards_equal(rewards: list[float]) -> bool:
    return max(rewards) - min(rewards) <= 1e-4


def test_stored_work_comes_back_whole_and_its_branches_continue_from_their_tokens(exact_engine, checker):
    """The wire form keeps every number the judgement reads; restored branches carry their whole
    context (prompt, sample, reasoning cue, reasoning), so a follow-up on them is the follow-up
    the computing replica's engine runs from its cache."""

    async def main():
        pipeline = RewardPipeline(exact_engine, HeuristicScorer(), checker, sharing=SharingLimits())
        opts = options(path=PathMode.LONG)
        item = ITEMS[6]  # "XLII": the judge's Yes/No decides
        (prompt_ids,) = await pipeline.encode_prompts([item])
        async with pipeline.question(item, opts, prompt_ids) as (work, _):
            here = await pipeline.judge(work, item, item.response, opts)
            cue_ids = exact_engine.encode(JUDGE.reasoning_cue)
            copy = restored(stored(work), work.key, prompt_ids, cue_ids, Shared.CACHED)
            elsewhere = await pipeline.judge(copy, item, item.response, opts)
        await pipeline.close()
        return work, copy, here, elsewhere

    work, copy, here, elsewhere = asyncio.run(main())
    assert copy.origin is Shared.CACHED
    assert (copy.tally, copy.route, copy.consensus, copy.usage) == (work.tally, work.route, work.consensus, work.usage)
    assert [b.text for b in copy.branches] == [b.text for b in work.branches]
    assert copy.reasoned is not None and work.reasoned is not None
    assert copy.reasoned.candidates == work.reasoned.candidates and copy.reasoned.weights == work.reasoned.weights
    assert here.judgements[0].by is elsewhere.judgements[0].by
    assert here.judgements[0].right == elsewhere.judgements[0].right
    assert here.judgements[0].p == pytest.approx(elsewhere.judgements[0].p, abs=1e-4)
    assert [c.verdict for c in here.candidates] == [c.verdict for c in elsewhere.candidates]


def test_a_question_without_a_seed_is_seeded_from_its_key(exact_engine, checker):
    """Where question work is shared, the same question draws the same samples in any process."""

    async def main():
        opts = options(path=PathMode.SHORT)
        texts = []
        for _ in range(2):  # two fresh windows: computed twice, from the same seed
            pipeline = RewardPipeline(exact_engine, HeuristicScorer(), checker, sharing=SharingLimits())
            (prompt_ids,) = await pipeline.encode_prompts([ITEMS[0]])
            async with pipeline.question(ITEMS[0], opts, prompt_ids) as (work, _):
                texts.append([b.text for b in work.branches])
            key = question_key(pipeline.judge_name, prompt_ids, opts)
            await pipeline.close()
        return texts, key

    texts, key = asyncio.run(main())
    assert texts[0] == texts[1]
    assert 0 <= derived_seed(key) < 2**30
