"""What the judge makes of a question alone, before any response: sample -> vote -> route -> (reason, score).

Solve first (templates.py): the judge's samples, their vote, the route and, on the long path, its
reasoned and scored candidates depend on the question, never on the response. So they are
computed once per question and every response to it is judged against the same work (service.py;
sharing.py keeps it for the responses that come later). The key names everything that decides it.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import TypeAdapter

from egrm.engines.base import Branch, BranchParams, Engine
from egrm.pipeline.consensus import Tally, choose_route, tally
from egrm.pipeline.longpath import Reasoned, Replayed, reason_and_score, usage_of
from egrm.pipeline.routing import Signals
from egrm.pipeline.scorer import Scorer
from egrm.pipeline.templates import JUDGE
from egrm.pipeline.types import (
    ConsensusMode,
    ExactConsensus,
    Judgement,
    JudgeOptions,
    PathMode,
    Route,
    Shared,
    Usage,
)
from egrm.pipeline.verifier import AnswerChecker

# What a token id held in a list costs in Python: a pointer, and an int object above 256.
_BYTES_PER_TOKEN = 8 + sys.getsizeof(2**20)


@dataclass(slots=True)
class QuestionWork:
    """The judge's work on one question; every response to it is judged against this."""

    key: bytes  # what decided it (question_key)
    # The M answer-only samples, the greedy one of the exact estimate (when asked), then the extra
    # samples of adaptive M (when drawn).
    branches: list[Branch]
    keys: list[str | None]  # each branch's answer class (equal answers share one)
    m: int
    has_greedy: bool
    tally: Tally  # the M samples' vote
    exact: ExactConsensus | None
    consensus: float  # the estimate routing used
    route: Route
    usage: Usage
    sample_ms: float
    extra_ms: float = 0.0  # of sample_ms: the extra samples'
    tally_all: Tally | None = None  # the vote of the M and the extra samples, when extra were drawn
    by_all: bool = False  # the extended vote routed (adaptive M): the short path answers by it
    reasoned: Reasoned | None = None  # the long path's candidates, when the route is long
    # A response's judgement that needed the judge's Yes/No follow-up, by (which judgement,
    # response): the same response gets the same verdict, whatever else ran beside it.
    followups: dict[tuple[str, str], tuple[Judgement, list[str | None], Usage]] = field(default_factory=dict)
    # How this replica got it: computed here, or read from the cluster's store (cluster.py): CACHED
    # finished there before it was asked for, JOINED finished by another replica while this waited.
    origin: Shared = Shared.COMPUTED

    @property
    def degraded(self) -> bool:
        return self.reasoned is not None and self.reasoned.degraded

    @property
    def samples(self) -> list[Branch]:
        return self.branches[: self.m]

    @property
    def greedy(self) -> Branch | None:
        return self.branches[self.m] if self.has_greedy else None

    @property
    def voters(self) -> list[int]:
        """The branches of the extended vote: the M samples and the extra ones."""
        return voters(self.m, self.has_greedy, len(self.branches))

    @property
    def samples_drawn(self) -> int:
        return len(self.voters)

    @property
    def extra_tokens(self) -> int:
        """Completion tokens of adaptive M's extra samples (the voters after the M)."""
        return sum(self.branches[i].completion_tokens for i in self.voters[self.m :])

    @property
    def handles(self) -> list[object]:
        """Every branch it holds: what the engine frees once the work is done with."""
        reasoning = self.reasoned.reasoning if self.reasoned else []
        return [b.handle for b in self.branches + reasoning]

    @property
    def texts(self) -> list[str]:
        return [b.text for b in self.branches]

    def leader(self, voters: list[int], majority: str | None) -> Branch | None:
        """The first voter that gave the majority answer (its branch continues for a Yes/No)."""
        return next((self.branches[i] for i in voters if self.keys[i] is not None and self.keys[i] == majority), None)

    @property
    def nbytes(self) -> int:
        """About what keeping it costs this process: every branch's tokens (its context, as the
        engine holds it), texts and memoised follow-ups. The KV its branches hold lives in the
        engine's pool, which takes it back first when it needs room."""
        branches = self.branches + (self.reasoned.reasoning if self.reasoned else [])
        tokens = sum(b.prompt_tokens + 2 * b.completion_tokens for b in branches)
        texts = sum(len(b.text) for b in branches) + sum(len(r) for _, r in self.followups)
        return 1024 + tokens * _BYTES_PER_TOKEN + 2 * texts + 512 * len(self.followups)


_WIRE = TypeAdapter(QuestionWork)
# Not stored: the key (the store's name for it), how a replica got it, the engine's handles
# (another replica rebuilds them from the token ids: restored()) and the memoised follow-ups
# (each replica's own, per response).
_NOT_STORED: dict[str, Any] = {
    "key": True,
    "origin": True,
    "followups": True,
    "branches": {"__all__": {"handle"}},
    "reasoned": {"reasoning": {"__all__": {"handle"}}},
}


def stored(work: QuestionWork) -> bytes:
    """The work as the cluster's store keeps it (JSON)."""
    return _WIRE.dump_json(work, exclude=_NOT_STORED)


def restored(
    data: bytes, key: bytes, prompt_ids: Sequence[int], cue_ids: Sequence[int], origin: Shared
) -> QuestionWork:
    """Work another replica stored, as this one judges against it: each branch's handle is its
    context as token ids (what that replica's engine held it by: the prompt, a sample's tokens,
    the reasoning cue, the reasoning's tokens), so a response's Yes/No follow-up can continue it."""
    work = _WIRE.validate_python({**json.loads(data), "key": key})
    prompt = tuple(prompt_ids)
    for branch in work.branches:
        branch.handle = Replayed((*prompt, *branch.token_ids))
    if work.reasoned is not None:
        # The first samples reasoned (all of them, or early stop's window): the candidates follow them.
        for sample, reasoning in zip(work.samples, work.reasoned.reasoning, strict=False):
            reasoning.handle = Replayed((*prompt, *sample.token_ids, *cue_ids, *reasoning.token_ids))
    work.origin = origin
    return work


def derived_seed(key: bytes) -> int:
    """A question's seed when the request brings none: the same samples wherever and whenever its
    work is computed (any replica, after a restart, with Redis gone), so equal answers get one
    reward. 30 bits: seed + 1000 + i (the reasoning's) still fits every engine's 32-bit seed."""
    return int.from_bytes(key[:4], "little") & 0x3FFF_FFFF


def question_key(model: str, prompt_ids: Sequence[int], options: JudgeOptions) -> bytes:
    """What decides a question's work: the judge model, the rendered judge prompt (question and
    reference, in the model's chat format) and every option the work reads; not the template,
    which only presents a judgement, nor return_samples."""
    decided = {
        "model": model,
        "temperatures": options.temperatures,
        "top_p": options.top_p,
        "tau": options.tau,
        "path": options.path.value,
        "consensus": options.consensus.value,
        "with_exact": options.with_exact,
        "long_max_tokens": options.long_max_tokens,
        "long_accept": options.long_accept,
        "long_window": options.long_window,
        "seed": options.seed,
        "policy": options.policy.key if options.policy is not None else None,
        "extra_always": options.extra_always,
    }
    digest = hashlib.blake2b(json.dumps(decided, sort_keys=True).encode(), digest_size=32)
    digest.update(b"".join(i.to_bytes(4, "little") for i in prompt_ids))
    return digest.digest()


async def judge_question(
    engine: Engine,
    scorer: Scorer,
    checker: AnswerChecker,
    key: bytes,
    prompt: str,
    prompt_ids: list[int],
    options: JudgeOptions,
    tag: object = None,
) -> QuestionWork:
    """Sample the judge's own answers, vote, route, and (long route) reason and score."""
    start = time.perf_counter()
    branches = await engine.sample(prompt_ids, short_answer_params(options), tag)
    keys = (await checker.compare([b.text for b in branches], [])).answer_keys
    counted = tally(keys[: options.m])
    greedy = branches[options.m] if options.needs_exact else None
    exact = ExactConsensus(keys[options.m], exact_probability(greedy)) if greedy else None
    policy = options.policy if options.path is PathMode.AUTO else None
    extra = options.extra_always or (policy.extra if policy and policy.wants_extra(counted.consensus) else 0)
    counted_all, extra_ms = None, 0.0
    if extra:  # adaptive M: more samples from the same cached prompt before deciding
        extra_start = time.perf_counter()
        branches += await engine.sample(prompt_ids, extra_params(options, extra), tag)
        keys = (await checker.compare([b.text for b in branches], [])).answer_keys
        counted_all = tally([keys[i] for i in voters(options.m, greedy is not None, len(branches))])
        extra_ms = (time.perf_counter() - extra_start) * 1000
    by_exact_estimate = exact is not None and options.consensus is ConsensusMode.EXACT
    consensus = exact.probability if exact is not None and by_exact_estimate else counted.consensus
    if policy is not None:
        signals = Signals(
            consensus=counted.consensus,
            exact=exact.probability if exact else None,
            agrees=exact.vote == counted.majority if exact else None,
            consensus_all=counted_all.consensus if counted_all else None,
        )
        route = Route.SHORT if policy.short(signals) else Route.LONG
        by_all = counted_all is not None and policy.wants_extra(counted.consensus)
        consensus = counted_all.consensus if by_all and counted_all else consensus
    else:
        route, by_all = choose_route(consensus, options.tau, options.path), False
    work = QuestionWork(
        key=key,
        branches=branches,
        keys=keys,
        m=options.m,
        has_greedy=greedy is not None,
        tally=counted,
        exact=exact,
        consensus=consensus,
        route=route,
        tally_all=counted_all,
        by_all=by_all,
        usage=usage_of(branches),
        sample_ms=(time.perf_counter() - start) * 1000,
        extra_ms=extra_ms,
    )
    if work.route is Route.LONG:
        work.reasoned = await reason_and_score(engine, scorer, checker, prompt, work.samples, options, tag)
        work.usage.add(work.reasoned.usage)
    return work


def voters(m: int, has_greedy: bool, branches: int) -> list[int]:
    """Which branches vote in the extended vote: the M samples, then the extra ones (the greedy
    branch of the exact estimate, between them, does not vote)."""
    return [*range(m), *range(m + has_greedy, branches)]


def answer_params(options: JudgeOptions, temperatures: Sequence[float], first_seed: int) -> list[BranchParams]:
    """Answer-only branches (the judge's own answer, ending at EOS), one per temperature, seeded
    from options.seed + first_seed on."""
    return [
        BranchParams(
            temperature=t,
            top_p=options.top_p,
            max_new_tokens=JUDGE.answer_tokens,
            seed=None if options.seed is None else options.seed + first_seed + i,
        )
        for i, t in enumerate(temperatures)
    ]


def extra_params(options: JudgeOptions, extra: int) -> list[BranchParams]:
    """Adaptive M's extra samples: the ladder again, on seeds of their own."""
    ladder = options.temperatures
    return answer_params(options, [ladder[i % len(ladder)] for i in range(extra)], first_seed=100)


def short_answer_params(options: JudgeOptions) -> list[BranchParams]:
    """One answer-only branch per ladder temperature, and a greedy one when the exact estimate is
    asked for."""
    params = answer_params(options, options.temperatures, first_seed=0)
    if options.needs_exact:
        params.append(replace(params[0], temperature=0.0, seed=None))
    return params


def exact_probability(greedy: Branch) -> float:
    """The model's probability (T=1) of its greedy short answer: the share of samples expected
    to agree with it at T=1."""
    if greedy.token_ids and not greedy.logprobs:
        raise ValueError("the engine returned no log-probabilities: the exact consensus needs them")
    return math.exp(sum(greedy.logprobs))
