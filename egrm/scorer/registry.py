"""The one place a scorer is built from a checkpoint (or the heuristic when there is none)."""

from __future__ import annotations

from pathlib import Path

from egrm.pipeline.scorer import Scorer
from egrm.scorer.heuristic import HeuristicScorer
from egrm.scorer.model import CHECKPOINT_NAME, DEFAULT_CHECKPOINT, TrainedScorer


class ScorerLoadError(RuntimeError):
    """The checkpoint cannot be turned into a scorer."""


HEURISTIC = "heuristic"
TRAINED = "trained"


def load_scorer(checkpoint: Path | str | None) -> Scorer:
    """None, "" or "trained" -> the checkpoint that ships with egrm (egrm/scorer/default_scorer.json);
    "heuristic" -> the heuristic; a path -> the checkpoint there (scorer.json or its folder).

    The trained checkpoint is the default: on the shipped judge's held-out candidates it ranks
    0.78 of (right, wrong) pairs right, the heuristic 0.45 (docs/training.md, "Training the scorer").
    The worker awaits score() on its event loop: a scorer that runs a model must do that work
    off the loop. The trained scorer is a few hundred multiply-adds per candidate: it runs inline.
    """
    if checkpoint == HEURISTIC:
        return HeuristicScorer()
    path = DEFAULT_CHECKPOINT if not checkpoint or checkpoint == TRAINED else Path(checkpoint)
    if path.is_dir():
        path = path / CHECKPOINT_NAME
    try:
        return TrainedScorer.load(path)
    except ValueError as exc:
        raise ScorerLoadError(str(exc)) from exc
