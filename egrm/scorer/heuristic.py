"""An in-process scorer from the engine's own signals; the trained worker replaces it."""

from __future__ import annotations

import math
from collections.abc import Sequence

from egrm.pipeline.scorer import Candidate


class HeuristicScorer:
    """q = half agreement with the other candidates, half the model's mean token probability.

    Agreement rewards answers the reasoning converges on; the mean probability prefers fluent,
    confident chains. A candidate with no parseable answer scores 0.
    Its score is not a probability of being right: scored alone, a candidate agrees with itself,
    so half the score is given.
    """

    calibrated = False

    async def score(self, candidates: Sequence[Candidate]) -> list[float]:
        return [self._one(c) for c in candidates]

    @staticmethod
    def _one(c: Candidate) -> float:
        if c.answer is None:
            return 0.0
        return 0.5 * c.agreement + 0.5 * math.exp(min(c.mean_logprob, 0.0))

    async def ready(self) -> bool:
        return True

    async def close(self) -> None:
        return None
