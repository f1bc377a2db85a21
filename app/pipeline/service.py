"""The reward pipeline, read aloud: render -> sample -> compare -> vote -> route -> (reason, score)
-> judge -> present."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Sequence
from dataclasses import replace

from app.aio import gather_or_cancel, within_deadline
from app.engines.base import Branch, BranchParams, Engine
from app.pipeline.consensus import choose_route, tally
from app.pipeline.judgement import by_equivalence, by_exact, by_verdicts
from app.pipeline.longpath import followup, run_long_path, usage_of, verdicts
from app.pipeline.templates import JUDGE, get_template
from app.pipeline.types import (
    ConsensusMode,
    ExactConsensus,
    ItemResult,
    JudgeItem,
    Judgement,
    JudgeOptions,
    Route,
    Sample,
    Timings,
    Usage,
    VerdictBy,
)
from app.pipeline.verifier import AnswerChecker, Comparison, MathVerifyChecker
from app.scorer.base import Scorer

# Tokenizing megabytes would stall every other request on the event loop: big batches go to a thread.
_OFF_LOOP_CHARS = 50_000


class PromptTooLongError(Exception):
    """An item's rendered judge prompt has more tokens than the request allows."""

    def __init__(self, index: int, tokens: int, limit: int):
        super().__init__(f"items[{index}] renders to a {tokens}-token judge prompt; the limit is {limit}")
        self.index, self.tokens, self.limit = index, tokens, limit


def timed_out(deadline_s: float) -> ItemResult:
    message = f"not judged within the request's deadline ({deadline_s:g} s); the other items were"
    return ItemResult(None, None, None, 0.0, {}, error=message, error_type="timeout_error")


class RewardPipeline:
    def __init__(self, engine: Engine, scorer: Scorer, checker: AnswerChecker | None = None):
        """checker: how answers are compared; by default math-verify in a worker process of its own
        (started on first use, stopped by close())."""
        self.engine = engine
        self.scorer = scorer
        self.checker = checker if checker is not None else MathVerifyChecker()

    async def close(self) -> None:
        """Stops the answer checker (the engine and the scorer belong to whoever built them)."""
        await self.checker.close()

    async def score(
        self,
        items: Sequence[JudgeItem],
        options: JudgeOptions,
        max_prompt_tokens: int | None = None,
        deadline_s: float | None = None,
    ) -> list[ItemResult]:
        """One result per item, in order; an item whose input the engine rejects gets an error.

        Every prompt is rendered and tokenized once, here; an item over max_prompt_tokens raises
        PromptTooLongError before any model work starts. At deadline_s (from the call) the items
        still running are cancelled and get a timeout error; the finished ones keep their results.
        """
        start = time.perf_counter()
        prompts = await self.encode_prompts(items)
        if max_prompt_tokens is not None:
            for i, size in enumerate(await self._judged_tokens(items, options.template, prompts)):
                if size > max_prompt_tokens:
                    raise PromptTooLongError(i, size, max_prompt_tokens)
        calls = [self._score_or_error(item, ids, options) for item, ids in zip(items, prompts, strict=True)]
        if deadline_s is None:
            # One item failing the whole request (e.g. the engine queue is full) stops the others
            # instead of leaving their work running for nobody (their queued jobs are cancelled).
            return await gather_or_cancel(calls)
        left = max(0.0, deadline_s - (time.perf_counter() - start))
        return await within_deadline(calls, left, lambda: timed_out(deadline_s))

    async def encode_prompts(self, items: Sequence[JudgeItem]) -> list[list[int]]:
        """The token ids of each item's judge prompt (what the engine will prefill)."""

        def encode() -> list[list[int]]:
            return [self.engine.encode_chat(JUDGE.messages(item)) for item in items]

        chars = sum(len(i.prompt) + len(i.reference or "") for i in items)
        return await asyncio.to_thread(encode) if chars > _OFF_LOOP_CHARS else encode()

    async def _judged_tokens(
        self, items: Sequence[JudgeItem], template: str, prompts: Sequence[list[int]]
    ) -> list[int]:
        """Tokens of what the judge may read of each item: its prompt and the follow-up turn that
        shows the longest response (not in the prompt, but the response is the bulk of an item)."""
        count = get_template(template).responses

        def tokens() -> list[int]:
            return [
                len(ids) + max(len(followup(self.engine, item, r)) for r in responses(item, count))
                for item, ids in zip(items, prompts, strict=True)
            ]

        chars = sum(len(i.response) + len(i.response_b or "") for i in items)
        return await asyncio.to_thread(tokens) if chars > _OFF_LOOP_CHARS else tokens()

    async def _score_or_error(self, item: JudgeItem, prompt_ids: list[int], options: JudgeOptions) -> ItemResult:
        try:
            return await self.score_item(item, options, prompt_ids)
        except ValueError as exc:  # e.g. the prompt does not fit the model's context
            return ItemResult(reward=None, answer=None, route=None, consensus=0.0, votes={}, error=str(exc))

    async def score_item(
        self, item: JudgeItem, options: JudgeOptions, prompt_ids: list[int] | None = None
    ) -> ItemResult:
        start = time.perf_counter()
        template = get_template(options.template)
        answers = responses(item, template.responses)
        result = await self._by_reference(item, answers)
        if result is None:
            if prompt_ids is None:
                (prompt_ids,) = await self.encode_prompts([item])
            if len(answers) > 1 and options.seed is None:  # both responses against the same samples
                options = replace(options, seed=random.randrange(2**31))
            runs = await gather_or_cancel([self.judge(item, r, options, prompt_ids) for r in answers])
            result = merged(runs)
        result.answer, result.reward = template.present(
            [j.p for j in result.judgements], [j.right for j in result.judgements]
        )
        result.timings.total_ms = (time.perf_counter() - start) * 1000
        return result

    async def _by_reference(self, item: JudgeItem, answers: Sequence[str]) -> ItemResult | None:
        """A reference that reads as math decides by itself, against every response that does."""
        if not item.reference:
            return None
        comparison = await self.checker.compare([item.reference], answers)
        (key,) = comparison.answer_keys
        if not all(comparison.checkable(key, i) for i in range(len(answers))):
            return None  # the judge reads the reference in its prompt
        judgements = [
            Judgement(float(k == key), k == key, VerdictBy.REFERENCE, key, a)
            for k, a in zip(comparison.response_keys, comparison.response_answers, strict=True)
        ]
        return ItemResult(None, None, Route.REFERENCE, 1.0, {}, judgements=judgements)

    async def judge(self, item: JudgeItem, response: str, options: JudgeOptions, prompt_ids: list[int]) -> ItemResult:
        """One response: sample the judge's own answers, vote, route, and judge on that route."""
        start = time.perf_counter()
        branches = await self.engine.sample(prompt_ids, short_answer_params(options))
        samples = branches[: options.m]  # then the greedy branch of the exact estimate, if asked
        comparison = await self.checker.compare([b.text for b in branches], [response])
        keys = comparison.answer_keys[: options.m]
        counted = tally(keys)
        greedy = branches[options.m] if options.needs_exact else None
        exact = ExactConsensus(comparison.answer_keys[-1], exact_probability(greedy)) if greedy else None
        by_exact_estimate = exact is not None and options.consensus is ConsensusMode.EXACT
        consensus = exact.probability if exact is not None and by_exact_estimate else counted.consensus
        route = choose_route(consensus, options.tau, options.path)
        result = ItemResult(
            reward=None,
            answer=None,
            route=route,
            consensus=consensus,
            votes=counted.votes,
            exact=exact,
            usage=usage_of(branches),
        )
        if options.return_samples:
            result.samples = [Sample(s.text, t, k) for s, t, k in zip(samples, options.temperatures, keys, strict=True)]
        # The short path's judgement: the vote's (its leader continues when the judge must say
        # Yes/No) and, when asked for, the exact estimate's (its greedy branch continues).
        # Evaluation (with_exact) reads both wherever it can; the long path keeps the leader.
        short = route is Route.SHORT
        leader = next((s for s, k in zip(samples, keys, strict=True) if k is not None and k == counted.majority), None)
        sampled = exact_short = None
        if short and (options.with_exact or not by_exact_estimate):
            sampled = await self._short(item, response, comparison, keys, counted.majority, leader, None, result.usage)
        if exact is not None and greedy is not None and (options.with_exact or (short and by_exact_estimate)):
            exact_short = await self._short(item, response, comparison, keys, exact.vote, greedy, exact, result.usage)
            result.exact = replace(exact, answer=exact_short.verdict)
        result.majority_answer = sampled.verdict if sampled else None
        result.timings = Timings(sample_ms=(time.perf_counter() - start) * 1000)
        if short:
            chosen = exact_short if by_exact_estimate else sampled
            assert chosen is not None  # computed above for the estimator that routes
            result.judgements = [chosen]
            return result
        long = await run_long_path(self.engine, self.scorer, self.checker, item, response, samples, options)
        result.judgements, result.candidates, result.degraded = [long.judgement], long.candidates, long.degraded
        result.usage.add(long.usage)
        result.timings.reasoning_ms, result.timings.scorer_ms = long.reasoning_ms, long.scorer_ms
        return result

    async def _short(
        self,
        item: JudgeItem,
        response: str,
        comparison: Comparison,
        keys: Sequence[str | None],
        answer: str | None,
        branch: Branch | None,
        exact: ExactConsensus | None,
        usage: Usage,
    ) -> Judgement:
        """The short path's judgement of the response against `answer` (the vote's or the greedy
        one): by equivalence where checkable, else by `branch`'s Yes/No follow-up."""
        ones = [1.0] * len(keys)
        decided = (
            by_exact(comparison, keys, answer, exact.probability)
            if exact is not None
            else by_equivalence(comparison, keys, ones, answer)
        )
        if decided is not None:
            return decided
        if branch is None:  # no sample gave an answer to hold the response against
            return Judgement(0.0, False, VerdictBy.JUDGE, None, comparison.response_answers[0])
        (verdict,) = await verdicts(self.engine, followup(self.engine, item, response), [branch])
        usage.add(usage_of([verdict]))
        return by_verdicts([verdict], [1.0], comparison, answer)


def responses(item: JudgeItem, count: int) -> list[str]:
    """The responses an item holds for a template: its response, and response_b for pairwise."""
    if count == 2 and item.response_b is None:
        raise ValueError("the pairwise template needs response_b")
    return [item.response, item.response_b or ""][:count]


def merged(runs: Sequence[ItemResult]) -> ItemResult:
    """Pairwise: the two responses' runs as one result. With the same seed their samples, votes
    and route are the same; the judgements and the work are both."""
    first = runs[0]
    for other in runs[1:]:
        first.judgements += other.judgements
        first.usage.add(other.usage)
        first.degraded = first.degraded or other.degraded
    return first


def short_answer_params(options: JudgeOptions) -> list[BranchParams]:
    """One answer-only branch per ladder temperature (the judge's own answer, ending at EOS),
    and a greedy one when the exact estimate is asked for."""
    params = [
        BranchParams(
            temperature=t,
            top_p=options.top_p,
            max_new_tokens=JUDGE.answer_tokens,
            seed=None if options.seed is None else options.seed + i,
        )
        for i, t in enumerate(options.temperatures)
    ]
    if options.needs_exact:
        params.append(replace(params[0], temperature=0.0, seed=None))
    return params


def exact_probability(greedy: Branch) -> float:
    """The model's probability (T=1) of its greedy short answer: the share of samples expected
    to agree with it at T=1."""
    if greedy.token_ids and not greedy.logprobs:
        raise ValueError("the engine returned no log-probabilities: the exact consensus needs them")
    return math.exp(sum(greedy.logprobs))
