"""The Scorer contract: rate long-path candidates so the pipeline can pick the best one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(slots=True)
class Candidate:
    """One chain-of-thought candidate and the signals the engine returned with it."""

    prompt: str
    response: str
    reasoning: str
    answer: str | None
    mean_logprob: float  # mean model log-prob of the candidate's tokens
    agreement: float  # share of the item's candidates with the same final answer
    tokens: int
    # Added for the trained scorer; defaults keep older callers valid.
    min_logprob: float = 0.0  # the least likely reasoning token
    final_logprob: float = 0.0  # log-prob of the final answer's tokens
    finished: bool = True  # the reasoning stopped at the final-answer cue, not at the token limit


@runtime_checkable
class Scorer(Protocol):
    @property
    def calibrated(self) -> bool:
        """Whether a score reads as the probability that the candidate is right (the trained
        scorer's does): the long path's early stop accepts a lone candidate on its score only then."""
        ...

    async def score(self, candidates: Sequence[Candidate]) -> list[float]:
        """A quality estimate in [0, 1] per candidate, in order."""
        ...

    async def ready(self) -> bool: ...

    async def close(self) -> None: ...
