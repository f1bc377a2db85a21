"""Typed inputs and outputs of the reward pipeline (no HTTP, no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Route(str, Enum):
    SHORT = "short"
    LONG = "long"


class PathMode(str, Enum):
    AUTO = "auto"
    SHORT = "short"
    LONG = "long"


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
    consensus: ConsensusMode = ConsensusMode.SAMPLED
    with_exact: bool = False  # estimate the exact consensus even when routing on the sampled one

    @property
    def needs_exact(self) -> bool:
        return self.with_exact or self.consensus is ConsensusMode.EXACT

    @property
    def m(self) -> int:
        return len(self.temperatures)


@dataclass(slots=True)
class Sample:
    """One answer-only branch as the client sees it."""

    text: str
    answer: str | None  # the answer it chose; None for a judge's own answer (solve first)
    temperature: float
    vote: str | None = None  # what it counted as in the consensus


@dataclass(frozen=True, slots=True)
class ExactConsensus:
    """Consensus without sampling noise: the probability (T=1) the model gives its most likely
    short answer, read from one greedy branch. With M samples and tau=0.8 a judge that is exactly
    50/50 still shows >= 4/5 agreement 37.5% of the time; this estimate shows 0.5."""

    vote: str | None  # the greedy short answer (the mode, where greedy finds it)
    probability: float
    answer: str | None = None  # the short path's answer from it, when it was asked for


@dataclass(slots=True)
class ScoredCandidate:
    """One long-path candidate: its reasoning, final answer and scorer score."""

    reasoning: str
    answer: str | None
    score: float


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
    reasoning_ms: float = 0.0
    scorer_ms: float = 0.0
    total_ms: float = 0.0


@dataclass(slots=True)
class ItemResult:
    reward: float | None
    answer: str | None
    route: Route | None
    consensus: float  # the estimate routing used (sampled or exact)
    votes: dict[str, int]
    exact: ExactConsensus | None = None
    majority_answer: str | None = None  # the short path's answer from the vote, when it was asked for
    samples: list[Sample] | None = None
    candidates: list[ScoredCandidate] | None = None
    degraded: bool = False
    error: str | None = None
    usage: Usage = field(default_factory=Usage)
    timings: Timings = field(default_factory=Timings)
