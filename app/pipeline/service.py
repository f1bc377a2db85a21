"""The reward pipeline, read aloud: render -> sample -> vote -> route -> (reason, score) -> reward."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from app.aio import gather_or_cancel
from app.engines.base import BranchParams, Engine
from app.pipeline.consensus import choose_route, tally
from app.pipeline.longpath import run_long_path, usage_of
from app.pipeline.templates import get_template
from app.pipeline.types import ItemResult, JudgeItem, JudgeOptions, Route, Sample, Timings
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
            for i, ids in enumerate(prompts):
                if len(ids) > max_prompt_tokens:
                    raise PromptTooLongError(i, len(ids), max_prompt_tokens)
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
        params = self._answer_params(options, template.answers, template.answer_tokens)
        sampling = time.perf_counter()
        samples = await self.engine.sample(prompt_ids, params)
        sampled = time.perf_counter()
        answers = [template.extract(s.text) for s in samples]
        votes = tally(answers)
        route = choose_route(votes.consensus, options.tau, options.path)
        result = ItemResult(
            reward=None,
            answer=votes.majority,
            route=route,
            consensus=votes.consensus,
            votes=votes.votes,
            usage=usage_of(samples),
            timings=Timings(sample_ms=(sampled - sampling) * 1000),
        )
        if options.return_samples:
            result.samples = [
                Sample(s.text, a, t) for s, a, t in zip(samples, answers, options.temperatures, strict=True)
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

    @staticmethod
    def _answer_params(options: JudgeOptions, answers: tuple[str, ...], tokens: int) -> list[BranchParams]:
        """Answer-only branches: one per ladder temperature, constrained to the allowed answers."""
        return [
            BranchParams(
                temperature=t,
                top_p=options.top_p,
                max_new_tokens=tokens,
                allowed=answers,
                seed=None if options.seed is None else options.seed + i,
            )
            for i, t in enumerate(options.temperatures)
        ]
