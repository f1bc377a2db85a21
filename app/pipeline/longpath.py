"""The long path: the answer-only samples become chain-of-thought candidates, then get scored.

Each branch continues from its own cache (the engine never prefills the prefix again) with a
reasoning cue and free reasoning; the result its reasoning reaches is its answer. The scorer
weighs the candidates, and the response is judged against their score-weighted vote: by the
verifier where both sides read as math, else by each candidate's Yes/No follow-up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.engines.base import Branch, BranchParams, Engine, FinishReason
from app.pipeline.judgement import by_equivalence, by_verdicts, vote_weights, weighted_vote
from app.pipeline.templates import JUDGE
from app.pipeline.types import JudgeItem, Judgement, JudgeOptions, ScoredCandidate, Usage
from app.pipeline.verifier import AnswerChecker
from app.scorer.base import Candidate, Scorer

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LongPathResult:
    judgement: Judgement
    candidates: list[ScoredCandidate]
    degraded: bool = False  # the scorer could not answer; the candidates weighed equally
    usage: Usage = field(default_factory=Usage)
    reasoning_ms: float = 0.0
    scorer_ms: float = 0.0


def usage_of(branches: Sequence[Branch]) -> Usage:
    return Usage(
        prompt_tokens=sum(b.prompt_tokens for b in branches),
        cached_prompt_tokens=sum(b.cached_prompt_tokens for b in branches),
        completion_tokens=sum(b.completion_tokens for b in branches),
    )


def followup(engine: Engine, item: JudgeItem, response: str) -> list[int]:
    """The token ids that close the judge's own answer and ask for its verdict on the response:
    the follow-up turn in the model's chat format, the response in it as data."""
    return engine.encode_chat(JUDGE.conversation(item, "", response), after=JUDGE.OWN_ANSWER)


async def verdicts(engine: Engine, ids: Sequence[int], branches: Sequence[Branch]) -> list[Branch]:
    """Each branch's Yes/No verdict after the follow-up `ids`: greedy, constrained to the two."""
    params = BranchParams(temperature=0.0, max_new_tokens=4, allowed=JUDGE.verdicts)
    return await engine.continue_branches([b.handle for b in branches], ids, [params] * len(branches))


async def reason(engine: Engine, samples: Sequence[Branch], options: JudgeOptions) -> list[Branch]:
    """Continue every sample with the reasoning cue and free reasoning (to its end of turn)."""
    seeds = [None if options.seed is None else options.seed + 1000 + i for i in range(len(samples))]
    params = [
        BranchParams(temperature=t, top_p=options.top_p, max_new_tokens=options.long_max_tokens, seed=seed)
        for t, seed in zip(options.temperatures, seeds, strict=True)
    ]
    return await engine.continue_branches([s.handle for s in samples], JUDGE.reasoning_cue, params)


def result_logprob(engine: Engine, branch: Branch, result: str | None) -> float:
    """The log-prob of the result where the reasoning wrote it last (0 when it cannot be found)."""
    if result is None:
        return 0.0
    ids, tokens = engine.encode(result), branch.token_ids
    for start in range(len(tokens) - len(ids), -1, -1):
        if ids and tokens[start : start + len(ids)] == ids:
            return sum(branch.logprobs[start : start + len(ids)])
    return 0.0


async def run_long_path(
    engine: Engine,
    scorer: Scorer,
    checker: AnswerChecker,
    item: JudgeItem,
    response: str,
    samples: Sequence[Branch],
    options: JudgeOptions,
) -> LongPathResult:
    start = time.perf_counter()
    reasoning = await reason(engine, samples, options)
    # A reasoning cut at the token limit has not reached its result: its last number is a step.
    finished = [r.finish_reason is FinishReason.STOP for r in reasoning]
    comparison = await checker.compare(
        [r.text if f else None for r, f in zip(reasoning, finished, strict=True)], [response]
    )
    keys = comparison.answer_keys
    reasoning_ms = (time.perf_counter() - start) * 1000
    given = sum(k is not None for k in keys)
    candidates = [
        Candidate(
            prompt=item.prompt,
            response=response,
            reasoning=s.text + JUDGE.reasoning_cue + r.text,
            answer=k,
            mean_logprob=r.mean_logprob,
            agreement=keys.count(k) / given if k is not None else 0.0,
            tokens=r.completion_tokens,
            min_logprob=min(r.logprobs, default=0.0),
            final_logprob=result_logprob(engine, r, k),
            finished=f,
        )
        for s, r, k, f in zip(samples, reasoning, keys, finished, strict=True)
    ]
    usage = usage_of(reasoning)
    start = time.perf_counter()
    degraded = False
    try:
        scores = await scorer.score(candidates)
    except Exception as exc:  # any scorer failure degrades to an equal-weight vote, never to an error
        log.warning("scorer failed, the candidates weigh equally: %r", exc)
        scores, degraded = [0.0] * len(candidates), True
    scorer_ms = (time.perf_counter() - start) * 1000
    weights = vote_weights(scores)
    winner = weighted_vote(keys, weights)
    judgement = by_equivalence(comparison, keys, weights, winner)
    verdict_texts: list[str | None] = [None] * len(candidates)
    if judgement is None:  # the response (or every result) is not checkable: the judge's Yes/No decides
        finals = await verdicts(engine, followup(engine, item, response), reasoning)
        judgement = by_verdicts(finals, weights, comparison, winner)
        verdict_texts = [JUDGE.verdict_of(f.text) for f in finals]
        usage.add(usage_of(finals))
    return LongPathResult(
        judgement=judgement,
        candidates=[
            ScoredCandidate(c.reasoning, c.answer, s, v)
            for c, s, v in zip(candidates, scores, verdict_texts, strict=True)
        ],
        degraded=degraded,
        usage=usage,
        reasoning_ms=reasoning_ms,
        scorer_ms=scorer_ms,
    )
