"""The reward pipeline, read aloud: render -> sample -> vote -> route -> (reason, score) -> reward."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import replace

from app.aio import gather_or_cancel
from app.engines.base import Branch, BranchParams, Engine
from app.pipeline.consensus import choose_route, tally
from app.pipeline.longpath import final_text, run_long_path, usage_of, verdicts
from app.pipeline.templates import JudgeTemplate, get_template
from app.pipeline.types import (
    ConsensusMode,
    ExactConsensus,
    ItemResult,
    JudgeItem,
    JudgeOptions,
    Route,
    Sample,
    Timings,
    Usage,
)
from app.scorer.base import Scorer

# Tokenizing megabytes would stall every other request on the event loop: big batches go to a thread.
_OFF_LOOP_CHARS = 50_000


class PromptTooLongError(Exception):
    """An item's rendered judge prompt has more tokens than the request allows."""

    def __init__(self, index: int, tokens: int, limit: int):
        super().__init__(f"items[{index}] renders to a {tokens}-token judge prompt; the limit is {limit}")
        self.index, self.tokens, self.limit = index, tokens, limit


class RewardPipeline:
    def __init__(self, engine: Engine, scorer: Scorer):
        self.engine = engine
        self.scorer = scorer

    async def score(
        self, items: Sequence[JudgeItem], options: JudgeOptions, max_prompt_tokens: int | None = None
    ) -> list[ItemResult]:
        """One result per item, in order; an item whose input the engine rejects gets an error.

        Every prompt is rendered and tokenized once, here; an item over max_prompt_tokens raises
        PromptTooLongError before any model work starts.
        """
        prompts = await self.encode_prompts(items, options.template)
        if max_prompt_tokens is not None:
            for i, size in enumerate(await self._judged_tokens(items, options.template, prompts)):
                if size > max_prompt_tokens:
                    raise PromptTooLongError(i, size, max_prompt_tokens)
        # One item failing the whole request (e.g. the engine queue is full) stops the others
        # instead of leaving their work running for nobody (their queued jobs are cancelled).
        return await gather_or_cancel(
            [self._score_or_error(item, ids, options) for item, ids in zip(items, prompts, strict=True)]
        )

    async def encode_prompts(self, items: Sequence[JudgeItem], template: str) -> list[list[int]]:
        """The token ids of each item's judge prompt (what the engine will prefill)."""
        judge = get_template(template)

        def encode() -> list[list[int]]:
            return [self.engine.encode(self.engine.render_chat(judge.messages(item))) for item in items]

        chars = sum(len(i.prompt) + len(i.response) + len(i.response_b or "") + len(i.reference or "") for i in items)
        return await asyncio.to_thread(encode) if chars > _OFF_LOOP_CHARS else encode()

    async def _judged_tokens(
        self, items: Sequence[JudgeItem], template: str, prompts: Sequence[list[int]]
    ) -> list[int]:
        """Tokens of what the judge reads of each item: its prompt and, solve first, the follow-up
        turn that shows the response (not in the prompt, but the response is the bulk of an item)."""
        judge = get_template(template)
        if not judge.solve_first:
            return [len(ids) for ids in prompts]

        def count() -> list[int]:
            return [
                len(ids) + self.engine.count_tokens(judge.followup_text(item, self.engine.render_chat))
                for item, ids in zip(items, prompts, strict=True)
            ]

        chars = sum(len(i.response) for i in items)
        return await asyncio.to_thread(count) if chars > _OFF_LOOP_CHARS else count()

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
        if prompt_ids is None:
            (prompt_ids,) = await self.encode_prompts([item], options.template)
        branches = await self.engine.sample(prompt_ids, short_answer_params(options, template))
        samples = branches[: options.m]  # then the greedy branch of the exact estimate, if asked
        votes = [template.vote(s.text) for s in samples]
        counted = tally(votes)
        leader = next((s for s, v in zip(samples, votes, strict=True) if v is not None and v == counted.majority), None)
        greedy = branches[options.m] if options.needs_exact else None
        exact = ExactConsensus(template.vote(greedy.text), exact_probability(greedy)) if greedy else None
        by_exact = exact is not None and options.consensus is ConsensusMode.EXACT
        consensus = exact.probability if exact is not None and by_exact else counted.consensus
        route = choose_route(consensus, options.tau, options.path)
        # The short path's answer: the vote itself, or (solve first) the verdict that follows it.
        # Evaluation (with_exact) reads both estimators' answers wherever it can: the greedy branch
        # always, the leader only on the short route (the long path continues it with reasoning).
        short = route is Route.SHORT
        asked = [leader] if short and (options.with_exact or not by_exact) else []
        if greedy is not None and (options.with_exact or (short and by_exact)):
            asked.append(greedy)
        answers, usage = await self._short_answers(template, item, asked)
        if exact is not None:
            exact = replace(exact, answer=answers.get(id(greedy)))
        short_answer = exact.answer if exact is not None and by_exact else answers.get(id(leader))
        result = ItemResult(
            reward=None,
            answer=short_answer if route is Route.SHORT else None,
            route=route,
            consensus=consensus,
            votes=counted.votes,
            exact=exact,
            majority_answer=answers.get(id(leader)),
            usage=usage_of(branches),
            timings=Timings(sample_ms=(time.perf_counter() - start) * 1000),
        )
        result.usage.add(usage)
        if options.return_samples:
            result.samples = [
                Sample(s.text, v if not template.solve_first else None, t, v)
                for s, v, t in zip(samples, votes, options.temperatures, strict=True)
            ]
        if route is Route.LONG:
            long = await run_long_path(self.engine, self.scorer, template, item, samples, options)
            result.answer, result.candidates, result.degraded = long.answer, long.candidates, long.degraded
            result.usage.add(long.usage)
            result.timings.reasoning_ms, result.timings.scorer_ms = long.reasoning_ms, long.scorer_ms
        if result.answer is None:
            result.error = "the judge gave no parseable answer"
        else:
            result.reward = template.reward(result.answer)
        result.timings.total_ms = (time.perf_counter() - start) * 1000
        return result

    async def _short_answers(
        self, template: JudgeTemplate, item: JudgeItem, branches: Sequence[Branch | None]
    ) -> tuple[dict[int, str | None], Usage]:
        """The answer each branch's short answer stands for, by id(branch): the answer it chose,
        or (solve first) the greedy verdict after a follow-up turn that shows the response."""
        chosen = list({id(b): b for b in branches if b is not None}.values())
        if not template.solve_first or not chosen:
            return {id(b): template.extract(b.text) for b in chosen}, Usage()
        finals = await verdicts(self.engine, template, final_text(self.engine, template, item), chosen)
        return {id(b): template.extract(f.text) for b, f in zip(chosen, finals, strict=True)}, usage_of(finals)


def short_answer_params(options: JudgeOptions, template: JudgeTemplate) -> list[BranchParams]:
    """One answer-only branch per ladder temperature, and a greedy one when the exact estimate is
    asked for. A choice is constrained to the allowed answers; a judge's own answer ends at EOS."""
    params = [
        BranchParams(
            temperature=t,
            top_p=options.top_p,
            max_new_tokens=template.answer_tokens,
            allowed=None if template.solve_first else template.answers,
            seed=None if options.seed is None else options.seed + i,
        )
        for i, t in enumerate(options.temperatures)
    ]
    if options.needs_exact:
        params.append(replace(params[0], temperature=0.0, seed=None))
    return params


def exact_probability(greedy: Branch) -> float:
    """The model's probability (T=1; within the allowed answers when constrained) of its greedy
    short answer: the share of samples expected to agree with it at T=1."""
    if greedy.token_ids and not greedy.logprobs:
        raise ValueError("the engine returned no log-probabilities: the exact consensus needs them")
    return math.exp(sum(greedy.logprobs))
