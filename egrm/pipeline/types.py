"""Typed inputs and outputs of the reward pipeline (no HTTP, no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from egrm.pipeline.routing import RoutingPolicy


class Route(str, Enum):
    SHORT = "short"
    LONG = "long"
    REFERENCE = "reference"  # the item's reference decided, by the verifier: no model call


class VerdictBy(str, Enum):
    """What decided whether a response is right."""

    EQUIVALENCE = "equivalence"  # the judge's own answer and the response's, compared by the verifier
    JUDGE = "judge"  # the judge's Yes/No follow-up (the response, or its answer, is not checkable)
    REFERENCE = "reference"  # the item's reference and the response's answer, by the verifier


class PathMode(str, Enum):
    AUTO = "auto"
    SHORT = "short"
    LONG = "long"


class Shared(str, Enum):
    """How an item got the judge's work on its question (pipeline/sharing.py)."""

    COMPUTED = "computed"  # it started the work
    JOINED = "joined"  # the work was running for another item or request: it waited for that
    CACHED = "cached"  # the work had finished within the window: it read it


class ConsensusMode(str, Enum):
    SAMPLED = "sampled"  # the M samples' vote: count(majority) / M (the method)
    EXACT = "exact"  # the model's own probability of its most likely short answer


@dataclass(slots=True)
class JudgeItem:
    prompt: str
    response: str
    response_b: str | None = None
    reference: str | None = None
    id: str | None = None


@dataclass(slots=True)
class JudgeOptions:
    """Per-request options, already resolved against the service defaults."""

    temperatures: list[float]
    top_p: float
    tau: float
    path: PathMode
    template: str
    return_samples: bool = False
    seed: int | None = None
    long_max_tokens: int = 128
    # Early stop on the long path (longpath.py): the first long_window candidates decide alone when
    # the scorer rates one at least long_accept; 0 = every candidate reasons to the end.
    long_accept: float = 0.0
    long_window: int = 1
    consensus: ConsensusMode = ConsensusMode.SAMPLED
    with_exact: bool = False  # estimate the exact consensus even when routing on the sampled one
    policy: RoutingPolicy | None = None  # routes the auto path instead of tau (routing.py)
    extra_always: int = 0  # evaluation: draw this many extra samples on every item (adaptive M, offline)

    @property
    def needs_exact(self) -> bool:
        policy_needs = self.policy is not None and self.policy.needs_exact
        return self.with_exact or self.consensus is ConsensusMode.EXACT or policy_needs

    @property
    def m(self) -> int:
        return len(self.temperatures)


@dataclass(frozen=True, slots=True)
class Judgement:
    """One response judged: the probability that it is right, the verdict, and what decided it."""

    p: float  # the judge's probability that the response is right, in [0, 1]
    right: bool  # the verdict
    by: VerdictBy
    judge_answer: str | None = None  # the judge's answer it was held against (a class of equivalent answers)
    response_answer: str | None = None  # the final answer read from the response; None: none readable

    @property
    def verdict(self) -> str:
        return "Yes" if self.right else "No"


@dataclass(slots=True)
class Sample:
    """One answer-only branch as the client sees it: the judge's own short answer."""

    text: str
    temperature: float
    vote: str | None = None  # what it counted as in the consensus (its class of equivalent answers)


@dataclass(frozen=True, slots=True)
class ExactConsensus:
    """Consensus without sampling noise: the probability (T=1) the model gives its most likely
    short answer, read from one greedy branch. With M samples and tau=0.8 a judge that is exactly
    50/50 still shows >= 4/5 agreement 37.5% of the time; this estimate shows 0.5."""

    vote: str | None  # the greedy short answer's class (the mode, where greedy finds it)
    probability: float
    answer: str | None = None  # the short path's verdict from it, when it was asked for


@dataclass(frozen=True, slots=True)
class ExtendedVote:
    """The vote of the M samples and adaptive M's extra ones."""

    consensus: float
    samples: int
    answer: str | None = None  # the short path's verdict by it, when asked for


@dataclass(slots=True)
class ScoredCandidate:
    """One long-path candidate: its reasoning, the result it reached, and its scorer score."""

    reasoning: str
    answer: str | None  # the result its reasoning reached (a class of equivalent answers)
    score: float
    verdict: str | None = None  # its Yes/No follow-up, where the judge's verdict decided


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, other: Usage) -> None:
        self.prompt_tokens += other.prompt_tokens
        self.cached_prompt_tokens += other.cached_prompt_tokens
        self.completion_tokens += other.completion_tokens


@dataclass(slots=True)
class Timings:
    sample_ms: float = 0.0
    extra_ms: float = 0.0  # of sample_ms: adaptive M's extra samples (drawing and reading them)
    reasoning_ms: float = 0.0
    scorer_ms: float = 0.0
    total_ms: float = 0.0


@dataclass(slots=True)
class ItemResult:
    reward: float | None
    answer: str | None  # the template's answer: Yes/No, 1..10, A/B/tie
    route: Route | None
    consensus: float  # the estimate routing used (sampled or exact)
    votes: dict[str, int]
    judgements: list[Judgement] = field(default_factory=list)  # one per response (pairwise: A, B)
    exact: ExactConsensus | None = None
    extended: ExtendedVote | None = None  # the vote with adaptive M's extra samples, when they were drawn
    majority_answer: str | None = None  # the short path's verdict from the vote, when it was asked for
    samples_drawn: int = 0  # answer-only samples drawn: M, and adaptive M's extra ones
    extra_tokens: int = 0  # completion tokens of adaptive M's extra samples (of usage's, where it computed them)
    samples: list[Sample] | None = None
    candidates: list[ScoredCandidate] | None = None
    degraded: bool = False
    shared: Shared | None = None  # the question's work came from another item or request (joined, cached)
    error: str | None = None
    error_type: str = "item_error"  # or "timeout_error": not judged within the request's deadline
    usage: Usage = field(default_factory=Usage)
    timings: Timings = field(default_factory=Timings)
