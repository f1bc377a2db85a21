"""The one place a scorer is built from a checkpoint (or the heuristic when there is none)."""

from __future__ import annotations

from pathlib import Path

from app.scorer.base import Scorer
from app.scorer.heuristic import HeuristicScorer


class ScorerLoadError(RuntimeError):
    """The checkpoint cannot be turned into a scorer."""


def load_scorer(checkpoint: Path | None) -> Scorer:
    """None -> the in-process heuristic; a folder -> the trained scorer saved there.

    The worker awaits score() on its event loop: a scorer that runs a model must do that work
    off the loop (asyncio.to_thread or its own thread), as the embedded engine does.
    """
    if checkpoint is None:
        return HeuristicScorer()
    raise ScorerLoadError(f"no trained scorer loader yet: cannot load checkpoint {checkpoint}")
