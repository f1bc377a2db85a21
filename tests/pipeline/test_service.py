"""The pipeline end to end on the real model, without HTTP."""

import asyncio
import time

import pytest

from egrm.engines.base import Branch, FinishReason
from egrm.pipeline.question import exact_probability
from egrm.pipeline.service import RewardPipeline
from egrm.pipeline.templates import JUDGE
from egrm.pipeline.types import ConsensusMode, JudgeItem, JudgeOptions, PathMode, Route, VerdictBy
from egrm.scorer.heuristic import HeuristicScorer
from egrm.scorer.registry import load_scorer

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
        long_max_tokens=48,
    )
    return JudgeOptions(**{**base, **kw})


class BrokenScorer(HeuristicScorer):
    """A scorer whose backend fails: the long path must degrade, not error."""

    async def score(self, candidates):
        raise ConnectionError("scorer unreachable")


def test_long_path_never_prefills_the_prefix_again(engine, checker):
    pipeline = RewardPipeline(engine, HeuristicScorer(), checker)
    result = asyncio.run(pipeline.score_item(ITEM, options(path=PathMode.LONG)))
    prefix_tokens = len(engine.encode_chat(JUDGE.messages(ITEM)))
    cue = engine.count_tokens(JUDGE.reasoning_cue)
    computed = result.usage.prompt_tokens - result.usage.cached_prompt_tokens
    # One prefill, then per branch only its pending token and the cue: re-prefilling would add 5x the prefix.
    assert prefix_tokens <= computed <= prefix_tokens + 5 * (1 + cue)
    assert result.route is Route.LONG and len(result.candidates) == 5
    assert all(c.reasoning.count(JUDGE.reasoning_cue) == 1 for c in result.candidates)
    # The response's number is checkable, so the candidates' results decide: no Yes/No follow-up.
    (judgement,) = result.judgements
    assert judgement.by is VerdictBy.EQUIVALENCE and all(c.verdict is None for c in result.candidates)
    weights = {}
    for c in result.candidates:
        if c.answer is not None:
            weights[c.answer] = weights.get(c.answer, 0.0) + max(c.score, 0.0)
    assert judgement.judge_answer == max(weights, key=weights.get)
    assert result.answer == ("Yes" if judgement.judge_answer == "42" else "No") and not result.degraded
    assert result.reward == pytest.approx(weights.get("42", 0.0) / sum(weights.values()))


def test_solve_first_votes_on_own_answers_then_compares_the_response(engine, checker):
    pipeline = RewardPipeline(engine, HeuristicScorer(), checker)
    result = asyncio.run(pipeline.score_item(ITEM, options(path=PathMode.SHORT, return_samples=True)))
    assert sum(result.votes.values()) == sum(s.vote is not None for s in result.samples)
    (judgement,) = result.judgements
    majority = max(result.votes, key=result.votes.get)
    assert judgement.by is VerdictBy.EQUIVALENCE and judgement.judge_answer == majority
    assert judgement.response_answer == "42" and result.answer == ("Yes" if majority == "42" else "No")
    assert result.reward == pytest.approx(result.votes.get("42", 0) / 5)
    # Nothing after the samples: the verifier compared, the model was not asked again.
    assert result.usage.completion_tokens == sum(engine.count_tokens(s.text) for s in result.samples)


def test_a_response_without_a_readable_answer_gets_the_judges_yes_no(engine, checker):
    pipeline = RewardPipeline(engine, HeuristicScorer(), checker)
    item = JudgeItem(prompt="What is 12 + 30?", response="XLII")
    short = asyncio.run(pipeline.score_item(item, options(path=PathMode.SHORT)))
    (j,) = short.judgements
    assert j.by is VerdictBy.JUDGE and j.response_answer is None and 0.0 <= short.reward <= 1.0
    assert short.answer == ("Yes" if short.reward >= 0.5 else "No")
    long = asyncio.run(pipeline.score_item(item, options(path=PathMode.LONG)))
    assert long.judgements[0].by is VerdictBy.JUDGE and all(c.verdict in ("Yes", "No") for c in long.candidates)


def test_a_checkable_reference_decides_without_the_model(engine, checker):
    pipeline = RewardPipeline(engine, HeuristicScorer(), checker)
    before = engine.stats().batches
    right = JudgeItem(prompt="What is 12 + 30?", response="That makes 42.", reference="42")
    wrong = JudgeItem(prompt="What is 12 + 30?", response="$\\boxed{41}$", reference="42")
    results = asyncio.run(pipeline.score([right, wrong], options()))
    assert [(r.route, r.answer, r.reward) for r in results] == [
        (Route.REFERENCE, "Yes", 1.0),
        (Route.REFERENCE, "No", 0.0),
    ]
    assert results[0].judgements[0].by is VerdictBy.REFERENCE and engine.stats().batches == before


def test_score_and_pairwise_rest_on_the_same_judgement(exact_engine, checker):
    pipeline = RewardPipeline(exact_engine, HeuristicScorer(), checker)
    verdict = asyncio.run(pipeline.score_item(ITEM, options(path=PathMode.SHORT)))
    score = asyncio.run(pipeline.score_item(ITEM, options(path=PathMode.SHORT, template="score")))
    assert score.reward == pytest.approx(verdict.reward) and score.answer == str(1 + int(9 * verdict.reward + 0.5))
    pair = JudgeItem(prompt=ITEM.prompt, response="42", response_b="41")
    ab = asyncio.run(pipeline.score_item(pair, options(path=PathMode.SHORT, template="pairwise")))
    ba = asyncio.run(
        pipeline.score_item(
            JudgeItem(ITEM.prompt, "41", response_b="42"), options(path=PathMode.SHORT, template="pairwise")
        )
    )
    # Each response judged alone against the same samples: swapping them mirrors the reward.
    assert ab.reward == pytest.approx(1 - ba.reward) and len(ab.judgements) == 2
    assert {ab.answer, ba.answer} in ({"A", "B"}, {"tie"})


def test_exact_consensus_routes_on_the_greedy_answers_probability(exact_engine, checker):
    pipeline = RewardPipeline(exact_engine, HeuristicScorer(), checker)
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


def test_scorer_failure_degrades_to_the_candidates_vote(engine, checker):
    pipeline = RewardPipeline(engine, BrokenScorer(), checker)
    result = asyncio.run(pipeline.score_item(ITEM, options(path=PathMode.LONG)))
    answers = [c.answer for c in result.candidates if c.answer is not None]
    assert result.degraded and result.error is None
    assert result.judgements[0].judge_answer == max(answers, key=answers.count)
    assert result.reward == pytest.approx(answers.count("42") / len(answers))
    # With early stop, a scorer that fails cannot accept the first candidate: every one is read.
    early = asyncio.run(pipeline.score_item(ITEM, options(path=PathMode.LONG, long_accept=0.5)))
    assert early.degraded and len(early.candidates) == 5


def test_batch_keeps_order_and_isolates_a_bad_item(engine, checker):
    items = [ITEM, JudgeItem(prompt="x " * 9000, response="y"), JudgeItem(prompt="Is water wet?", response="Yes")]
    pipeline = RewardPipeline(engine, HeuristicScorer(), checker)
    results = asyncio.run(pipeline.score(items, options(path=PathMode.SHORT)))
    assert [r.error is None for r in results] == [True, False, True]
    assert results[1].reward is None and "context" in results[1].error


def test_a_refused_item_cancels_its_siblings(loaded_fp32, checker):
    from egrm.engines.base import EngineBusyError
    from egrm.engines.embedded.engine import EmbeddedEngine
    from tests.engines.test_batching import hold_model_thread

    engine = EmbeddedEngine(loaded_fp32, max_queue=1)
    try:
        release = hold_model_thread(engine)
        pipeline = RewardPipeline(engine, HeuristicScorer(), checker)
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


def test_adaptive_m_draws_more_samples_from_the_prompt_and_routes_on_them(engine, checker):
    from egrm.pipeline.routing import RoutingPolicy

    more = RoutingPolicy("every vote draws 3 more", 0.0, extra=3, borderline=1.01, min_consensus_all=0.0)
    result = asyncio.run(
        RewardPipeline(engine, HeuristicScorer(), checker).score_item(ITEM, options(policy=more, return_samples=True))
    )
    assert result.samples_drawn == 8 and len(result.samples) == 8 and result.route is Route.SHORT
    assert result.extended is not None and result.extended.samples == 8
    assert sum(result.votes.values()) == sum(s.vote is not None for s in result.samples)  # the vote of all 8
    assert result.consensus == result.extended.consensus
    never = RoutingPolicy("a greedy answer never that sure", 0.0, min_exact=1.01)
    long = asyncio.run(RewardPipeline(engine, HeuristicScorer(), checker).score_item(ITEM, options(policy=never)))
    assert long.route is Route.LONG and long.samples_drawn == 5 and long.exact is not None  # it read the greedy one


def test_early_stop_decides_on_the_first_candidate_when_the_scorer_accepts_it(exact_engine, checker):
    pipeline = RewardPipeline(exact_engine, load_scorer(None), checker)  # the trained scorer: a probability of right
    full = asyncio.run(pipeline.score_item(ITEM, options(path=PathMode.LONG)))

    def reasoned(**kw):
        return asyncio.run(pipeline.score_item(ITEM, options(path=PathMode.LONG, **kw)))

    # A threshold no score reaches: the window never decides, every candidate is read and scored
    # together, exactly as without early stop (the spares ran meanwhile, then as live work).
    spare = exact_engine.stats().spare_tokens
    never = reasoned(long_accept=1.0)
    assert exact_engine.stats().spare_tokens > spare  # alone, they rode beside the window: rows it had to spare
    assert [(c.reasoning, c.answer) for c in never.candidates] == [(c.reasoning, c.answer) for c in full.candidates]
    assert [c.score for c in never.candidates] == pytest.approx([c.score for c in full.candidates])
    assert never.reward == pytest.approx(full.reward) and never.answer == full.answer
    # A threshold every score passes: the first candidate (the coldest sample's) decides alone.
    (only,) = reasoned(long_accept=1e-6).candidates
    assert only.reasoning == full.candidates[0].reasoning
    first_two = reasoned(long_accept=1e-6, long_window=2)
    assert [c.reasoning for c in first_two.candidates] == [c.reasoning for c in full.candidates[:2]]
    assert first_two.usage.completion_tokens < full.usage.completion_tokens
    # The spares were dropped: nothing is left running in the engine.
    assert exact_engine.run_on_model_thread(lambda: len(exact_engine.core.scheduler.jobs)) == 0
