"""The trained scorer at serving time: a small MLP over a candidate's engine signals.

The checkpoint is one JSON file: feature names, their standardisation and the weights (a few
hundred numbers), small enough for git, readable in a diff, loaded without pickle. Serving runs
the forward in numpy: no torch in the worker, and no second OpenMP team next to the embedded
engine's model thread when the scorer runs in the API process (see engines/embedded/scheduler.py).
Training (egrm/training/scorer_train.py) builds the same network in torch; a test holds the two equal.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from egrm.pipeline.scorer import Candidate
from egrm.scorer.features import FEATURES, vector

CHECKPOINT_NAME = "scorer.json"  # what `egrm train-scorer --out DIR` writes in DIR
DEFAULT_CHECKPOINT = Path(__file__).with_name("default_scorer.json")
# torch parameter names of ScorerNet, in the order the forward uses them
PARAMS = ("mean", "std", "layers.0.weight", "layers.0.bias", "layers.2.weight", "layers.2.bias")


@dataclass(slots=True)
class Checkpoint:
    features: tuple[str, ...]
    hidden: int
    state: dict[str, list[float]]  # parameter name -> values, row-major
    meta: dict[str, Any]  # how it was trained and what it scored

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {"features": list(self.features), "hidden": self.hidden, "meta": self.meta, "state": self.state}
        path.write_text(json.dumps(body, indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: Path) -> Checkpoint:
        try:
            body = json.loads(path.read_text())
            checkpoint = cls(tuple(body["features"]), int(body["hidden"]), body["state"], body.get("meta", {}))
            checkpoint.arrays()  # shapes checked now, not at the first request
        except (OSError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: not a scorer checkpoint ({exc})") from exc
        unknown = set(checkpoint.features) - set(FEATURES)
        if unknown:
            raise ValueError(f"{path}: unknown features {sorted(unknown)}")
        return checkpoint

    def arrays(self) -> list[np.ndarray]:
        n, h = len(self.features), self.hidden
        shapes = {"mean": (n,), "std": (n,), "layers.0.weight": (h, n), "layers.0.bias": (h,)}
        shapes |= {"layers.2.weight": (1, h), "layers.2.bias": (1,)}
        return [np.asarray(self.state[k], dtype=np.float64).reshape(shapes[k]) for k in PARAMS]


class TrainedScorer:
    """The Scorer protocol over a checkpoint; microseconds per candidate, so it runs inline."""

    calibrated = True  # trained on right/wrong labels: its score is a probability of being right

    def __init__(self, checkpoint: Checkpoint):
        self.checkpoint = checkpoint
        self._mean, self._std, self._w1, self._b1, self._w2, self._b2 = checkpoint.arrays()

    @classmethod
    def load(cls, path: Path = DEFAULT_CHECKPOINT) -> TrainedScorer:
        return cls(Checkpoint.load(path))

    def predict(self, candidates: Sequence[Candidate]) -> list[float]:
        if not candidates:
            return []
        x = np.array([vector(c, self.checkpoint.features) for c in candidates], dtype=np.float64)
        hidden = np.tanh(((x - self._mean) / self._std) @ self._w1.T + self._b1)
        logits = (hidden @ self._w2.T + self._b2)[:, 0]
        return [float(v) for v in 1 / (1 + np.exp(-logits))]

    async def score(self, candidates: Sequence[Candidate]) -> list[float]:
        return self.predict(candidates)

    async def ready(self) -> bool:
        return True

    async def close(self) -> None:
        return None
