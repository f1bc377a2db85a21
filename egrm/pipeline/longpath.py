"""The long path: the answer-only samples become chain-of-thought candidates, then get scored.

Each branch continues from its own cache (the engine never prefills the prefix again) with a
reasoning cue and free reasoning; the result its reasoning reaches is its answer. The scorer
weighs the candidates, and the response is judged against their score-weighted vote: by the
verifier where both sides read as math, else by each candidate's Yes/No follow-up.

Early stop (options.long_accept > 0): the first `long_window` candidates are read and scored
first; when the scorer rates one at least long_accept, its result is the judge's answer and the
other candidates are not needed. They start at once all the same, as spare work (SpareTag): an
engine that ranks work runs them only in rows a step has to spare, so one request alone waits no
longer than for all M together, while under load their compute goes to live work, and they are
aborted when the window decides. When it does not, every candidate is read and scored together,
exactly as without early stop. The trained scorer reads whether the working's arithmetic holds:
on 150 calibration items (docs/evaluation.md) the first candidate alone, accepted at 0.9, decided
123 with the same accuracy as all five. A scorer whose score is no such probability (the
heuristic's: `calibrated` false, as a worker says in each answer) never stops a long path early.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from egrm.aio import cancel_all, gather_or_cancel
from egrm.engines.base import Branch, BranchParams, Engine, FinishReason, SpareTag
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

    # One per sample that reasoned, in the samples' order (early stop: the first ones only).
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


def reasoning_params(options: JudgeOptions) -> list[BranchParams]:
    """Sample i's reasoning: its ladder temperature, free to its end of turn, seeded apart."""
    seeds = [None if options.seed is None else options.seed + 1000 + i for i in range(options.m)]
    return [
        BranchParams(temperature=t, top_p=options.top_p, max_new_tokens=options.long_max_tokens, seed=seed)
        for t, seed in zip(options.temperatures, seeds, strict=True)
    ]


async def reason(
    engine: Engine, samples: Sequence[Branch], params: Sequence[BranchParams], tag: object = None
) -> list[Branch]:
    """Continue every sample with the reasoning cue and free reasoning (to its end of turn)."""
    if not samples:
        return []
    return await engine.continue_branches([s.handle for s in samples], JUDGE.reasoning_cue, list(params), tag)


def result_logprob(engine: Engine, branch: Branch, result: str | None) -> float:
    """The log-prob of the result where the reasoning wrote it last (0 when it cannot be found)."""
    if result is None:
        return 0.0
    ids, tokens = engine.encode(result), branch.token_ids
    for start in range(len(tokens) - len(ids), -1, -1):
        if ids and tokens[start : start + len(ids)] == ids:
            return sum(branch.logprobs[start : start + len(ids)])
    return 0.0


@dataclass(slots=True)
class _Read:
    """Candidates read off their reasoning, not yet weighed."""

    reasoning: list[Branch]
    texts: list[str | None]
    candidates: list[Candidate]


async def _read(
    engine: Engine, checker: AnswerChecker, prompt: str, samples: Sequence[Branch], reasoning: list[Branch]
) -> _Read:
    """Each candidate's result, and what the scorer sees of it (agreement among these candidates)."""
    # A reasoning cut at the token limit has not reached its result: its last number is a step.
    finished = [r.finish_reason is FinishReason.STOP for r in reasoning]
    texts = [r.text if f else None for r, f in zip(reasoning, finished, strict=True)]
    keys = (await checker.compare(texts, [])).answer_keys
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
    return _Read(reasoning, texts, candidates)


async def _score(scorer: Scorer, candidates: Sequence[Candidate]) -> tuple[list[float], bool]:
    """The scorer's scores, and whether it failed (then every candidate weighs the same)."""
    try:
        return await scorer.score(candidates), False
    except Exception as exc:  # any scorer failure degrades to an equal-weight vote, never to an error
        log.warning("scorer failed, the candidates weigh equally: %r", exc)
        return [0.0] * len(candidates), True


async def reason_and_score(
    engine: Engine,
    scorer: Scorer,
    checker: AnswerChecker,
    prompt: str,
    samples: Sequence[Branch],
    options: JudgeOptions,
    tag: object = None,
) -> Reasoned:
    """Reason on from the samples, read each result, and score the candidates: every sample, or
    with early stop the first window when the scorer accepts one of them (see the module's doc)."""
    start = time.perf_counter()
    params = reasoning_params(options)
    early = options.long_accept > 0 and scorer.calibrated
    window = min(options.long_window, len(samples)) if early else len(samples)
    needed = False  # the spare candidates, once the window has not decided
    spare_tag = SpareTag(tag, lambda: needed)
    spares = asyncio.ensure_future(reason(engine, samples[window:], params[window:], spare_tag))
    scorer_ms = 0.0
    try:
        first = await reason(engine, samples[:window], params[:window], tag)
        read = await _read(engine, checker, prompt, samples[:window], first)
        if window < len(samples):
            scored_at = time.perf_counter()
            scores, degraded = await _score(scorer, read.candidates)
            scorer_ms += (time.perf_counter() - scored_at) * 1000
            if not degraded and scorer.calibrated and max(scores) >= options.long_accept:
                return _reasoned(read, scores, degraded, start, scorer_ms)
            needed = True  # the spares are live work now; they may have run ahead in spare rows
            read = await _read(engine, checker, prompt, samples, read.reasoning + await spares)
    finally:
        await cancel_all([spares])  # decided without them (or failed): the engine drops their work
        if not needed and spares.done() and not spares.cancelled() and spares.exception() is None:
            engine.release([b.handle for b in spares.result()])  # they finished beside the window: unread
    scored_at = time.perf_counter()
    scores, degraded = await _score(scorer, read.candidates)
    return _reasoned(read, scores, degraded, start, scorer_ms + (time.perf_counter() - scored_at) * 1000)


def _reasoned(read: _Read, scores: list[float], degraded: bool, start: float, scorer_ms: float) -> Reasoned:
    weights = vote_weights(scores)
    keys = [c.answer for c in read.candidates]
    return Reasoned(
        candidates=[ScoredCandidate(c.reasoning, c.answer, s) for c, s in zip(read.candidates, scores, strict=True)],
        texts=read.texts,
        reasoning=read.reasoning,
        weights=weights,
        winner=weighted_vote(keys, weights),
        degraded=degraded,
        usage=usage_of(read.reasoning),
        reasoning_ms=(time.perf_counter() - start) * 1000 - scorer_ms,
        scorer_ms=scorer_ms,
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
