"""The long path: the answer-only samples become chain-of-thought candidates, then get scored.

Each branch continues from its own cache (the engine never prefills the prefix again): first
with a reasoning cue and free reasoning, then with a final-answer cue and a constrained answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.engines.base import Branch, BranchParams, Engine, FinishReason
from app.pipeline.consensus import tally
from app.pipeline.templates import JudgeTemplate
from app.pipeline.types import JudgeItem, JudgeOptions, ScoredCandidate, Usage
from app.scorer.base import Candidate, Scorer

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LongPathResult:
    answer: str | None
    candidates: list[ScoredCandidate]
    degraded: bool = False  # the scorer could not answer; the majority of candidates was used
    usage: Usage = field(default_factory=Usage)
    reasoning_ms: float = 0.0
    scorer_ms: float = 0.0


def usage_of(branches: Sequence[Branch]) -> Usage:
    return Usage(
        prompt_tokens=sum(b.prompt_tokens for b in branches),
        cached_prompt_tokens=sum(b.cached_prompt_tokens for b in branches),
        completion_tokens=sum(b.completion_tokens for b in branches),
    )


def final_text(engine: Engine, template: JudgeTemplate, item: JudgeItem) -> str:
    """What asks a branch for its final answer: the final cue, or (solve first) the follow-up turn
    that shows the response and asks for the verdict."""
    return template.followup_text(item, engine.render_chat) if template.solve_first else template.final_cue


async def verdicts(engine: Engine, template: JudgeTemplate, final: str, branches: Sequence[Branch]) -> list[Branch]:
    """Each branch's final answer: greedy, constrained to the template's answers."""
    params = BranchParams(temperature=0.0, max_new_tokens=template.answer_tokens, allowed=template.answers)
    return await engine.continue_branches([b.handle for b in branches], final, [params] * len(branches))


async def reason(
    engine: Engine, template: JudgeTemplate, samples: Sequence[Branch], options: JudgeOptions, final: str
) -> tuple[list[Branch], list[Branch]]:
    """Continue every sample with reasoning, then ask each for its final answer."""
    seeds = [None if options.seed is None else options.seed + 1000 + i for i in range(len(samples))]
    reasoning = await engine.continue_branches(
        [s.handle for s in samples],
        template.reasoning_cue,
        [
            BranchParams(
                temperature=t,
                top_p=options.top_p,
                max_new_tokens=options.long_max_tokens,
                stop=(template.final_cue.strip(),),
                seed=seed,
            )
            for t, seed in zip(options.temperatures, seeds, strict=True)
        ],
    )
    return reasoning, await verdicts(engine, template, final, reasoning)


async def run_long_path(
    engine: Engine,
    scorer: Scorer,
    template: JudgeTemplate,
    item: JudgeItem,
    samples: Sequence[Branch],
    options: JudgeOptions,
) -> LongPathResult:
    start = time.perf_counter()
    reasoning, finals = await reason(engine, template, samples, options, final_text(engine, template, item))
    reasoning_ms = (time.perf_counter() - start) * 1000
    answers = [template.extract(f.text) for f in finals]
    candidates = [
        Candidate(
            prompt=item.prompt,
            response=item.response,
            reasoning=s.text + template.reasoning_cue + r.text,
            answer=a,
            mean_logprob=_mean(r.logprobs + f.logprobs),
            agreement=(answers.count(a) / len(answers)) if a is not None else 0.0,
            tokens=r.completion_tokens + f.completion_tokens,
            min_logprob=min(r.logprobs, default=0.0),
            final_logprob=sum(f.logprobs),
            finished=r.finish_reason is FinishReason.STOP,
        )
        for s, r, f, a in zip(samples, reasoning, finals, answers, strict=True)
    ]
    usage = usage_of([*reasoning, *finals])
    start = time.perf_counter()
    try:
        scores = await scorer.score(candidates)
    except Exception as exc:  # any scorer failure degrades to a vote, never to an error
        log.warning("scorer failed, using the candidates' majority: %r", exc)
        return LongPathResult(
            answer=tally(answers).majority,
            candidates=[ScoredCandidate(c.reasoning, c.answer, 0.0) for c in candidates],
            degraded=True,
            usage=usage,
            reasoning_ms=reasoning_ms,
            scorer_ms=(time.perf_counter() - start) * 1000,
        )
    scorer_ms = (time.perf_counter() - start) * 1000
    best = max(range(len(candidates)), key=lambda i: scores[i])
    return LongPathResult(
        answer=candidates[best].answer,
        candidates=[ScoredCandidate(c.reasoning, c.answer, s) for c, s in zip(candidates, scores, strict=True)],
        usage=usage,
        reasoning_ms=reasoning_ms,
        scorer_ms=scorer_ms,
    )


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0
