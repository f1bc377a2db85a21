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

from egrm.aio import gather_or_cancel
from egrm.engines.base import Branch, BranchParams, Engine, FinishReason
from egrm.pipeline.judgement import by_equivalence, by_verdicts, vote_weights, weighted_vote
from egrm.pipeline.scorer import Candidate, Scorer
from egrm.pipeline.templates import JUDGE
from egrm.pipeline.types import JudgeItem, Judgement, JudgeOptions, ScoredCandidate, Usage
from egrm.pipeline.verifier import AnswerChecker

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Reasoned:
    """The long path's question-level half: the reasoned candidates, their results and scores.
    It depends on the question alone, so every response to the question is judged against it."""

    candidates: list[ScoredCandidate]  # reasoning, result and score (no verdict: that is per response)
    texts: list[str | None]  # what each result is read from: None where the reasoning was cut short
    reasoning: list[Branch]  # the reasoning branches: a response's Yes/No follow-up continues them
    weights: list[float]  # each candidate's weight in the vote
    winner: str | None  # the class of results with the most weight: the judge's answer
    degraded: bool = False  # the scorer could not answer; the candidates weighed equally
    usage: Usage = field(default_factory=Usage)
    reasoning_ms: float = 0.0
    scorer_ms: float = 0.0

    @property
    def keys(self) -> list[str | None]:
        return [c.answer for c in self.candidates]


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


@dataclass(frozen=True, slots=True)
class Replayed:
    """The handle of a branch computed on another replica (read from the cluster's store): its
    whole context as token ids, the prompt's and its own. This engine holds no cache for it, so
    continuing it prefills them (where the engine's prefix cache does not hold them already)."""

    ids: tuple[int, ...]


async def verdicts(engine: Engine, ids: Sequence[int], branches: Sequence[Branch], tag: object = None) -> list[Branch]:
    """Each branch's Yes/No verdict after the follow-up `ids`: greedy, constrained to the two.
    Continuing leaves the branches as they were, for the next response's follow-up; a verdict is
    never continued, so its own branch is released at once."""
    params = BranchParams(temperature=0.0, max_new_tokens=4, allowed=JUDGE.verdicts)
    handles = [b.handle for b in branches]
    if all(isinstance(h, Replayed) for h in handles):
        calls = [engine.sample([*h.ids, *ids], [params], tag) for h in handles]
        said = [branch for (branch,) in await gather_or_cancel(calls)]
    else:
        said = await engine.continue_branches(handles, ids, [params] * len(branches), tag)
    engine.release([v.handle for v in said])
    return said


async def reason(engine: Engine, samples: Sequence[Branch], options: JudgeOptions, tag: object = None) -> list[Branch]:
    """Continue every sample with the reasoning cue and free reasoning (to its end of turn)."""
    seeds = [None if options.seed is None else options.seed + 1000 + i for i in range(len(samples))]
    params = [
        BranchParams(temperature=t, top_p=options.top_p, max_new_tokens=options.long_max_tokens, seed=seed)
        for t, seed in zip(options.temperatures, seeds, strict=True)
    ]
    return await engine.continue_branches([s.handle for s in samples], JUDGE.reasoning_cue, params, tag)


def result_logprob(engine: Engine, branch: Branch, result: str | None) -> float:
    """The log-prob of the result where the reasoning wrote it last (0 when it cannot be found)."""
    if result is None:
        return 0.0
    ids, tokens = engine.encode(result), branch.token_ids
    for start in range(len(tokens) - len(ids), -1, -1):
        if ids and tokens[start : start + len(ids)] == ids:
            return sum(branch.logprobs[start : start + len(ids)])
    return 0.0


async def reason_and_score(
    engine: Engine,
    scorer: Scorer,
    checker: AnswerChecker,
    prompt: str,
    samples: Sequence[Branch],
    options: JudgeOptions,
    tag: object = None,
) -> Reasoned:
    """Reason on from every sample, read each result, and score the candidates."""
    start = time.perf_counter()
    reasoning = await reason(engine, samples, options, tag)
    # A reasoning cut at the token limit has not reached its result: its last number is a step.
    finished = [r.finish_reason is FinishReason.STOP for r in reasoning]
    texts = [r.text if f else None for r, f in zip(reasoning, finished, strict=True)]
    keys = (await checker.compare(texts, [])).answer_keys
    reasoning_ms = (time.perf_counter() - start) * 1000
    given = sum(k is not None for k in keys)
    candidates = [
        Candidate(
            prompt=prompt,
            response="",  # the judge's own reasoning on the question: no response is in it
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
    start = time.perf_counter()
    degraded = False
    try:
        scores = await scorer.score(candidates)
    except Exception as exc:  # any scorer failure degrades to an equal-weight vote, never to an error
        log.warning("scorer failed, the candidates weigh equally: %r", exc)
        scores, degraded = [0.0] * len(candidates), True
    weights = vote_weights(scores)
    return Reasoned(
        candidates=[ScoredCandidate(c.reasoning, c.answer, s) for c, s in zip(candidates, scores, strict=True)],
        texts=texts,
        reasoning=reasoning,
        weights=weights,
        winner=weighted_vote(keys, weights),
        degraded=degraded,
        usage=usage_of(reasoning),
        reasoning_ms=reasoning_ms,
        scorer_ms=(time.perf_counter() - start) * 1000,
    )


async def judge_long(
    engine: Engine, checker: AnswerChecker, reasoned: Reasoned, item: JudgeItem, response: str, tag: object = None
) -> tuple[Judgement, list[str | None], Usage]:
    """One response against the reasoned candidates: by the verifier where both sides read as
    math, else by each candidate's Yes/No follow-up. Returns the judgement, each candidate's
    verdict (where they decided) and the tokens the follow-ups took."""
    comparison = await checker.compare(reasoned.texts, [response])
    judgement = by_equivalence(comparison, reasoned.keys, reasoned.weights, reasoned.winner)
    if judgement is not None:
        return judgement, [None] * len(reasoned.candidates), Usage()
    # The response (or every result) is not checkable: the judge's Yes/No decides.
    finals = await verdicts(engine, followup(engine, item, response), reasoned.reasoning, tag)
    judgement = by_verdicts(finals, reasoned.weights, comparison, reasoned.winner)
    return judgement, [JUDGE.verdict_of(f.text) for f in finals], usage_of(finals)
