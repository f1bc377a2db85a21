"""The scorer's training loss: regression to the candidate's quality plus a ranking hinge.

    L = a * Huber(q, q_hat; delta) + (1 - a) * mean(max(0, margin - (s(r+) - s(r-))))

The Huber term calibrates q_hat to the quality label; the hinge term asks every better
candidate of an item to outscore its worse sibling by `margin`, which is what picking the
best candidate needs. Defaults from the method: a = 0.7, delta = 1.0, margin = 0.1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True, slots=True)
class HybridLoss:
    a: float = 0.7
    delta: float = 1.0
    margin: float = 0.1

    def __post_init__(self) -> None:
        if not 0.0 <= self.a <= 1.0:
            raise ValueError(f"a must be in [0, 1], got {self.a}")
        if self.delta <= 0 or self.margin < 0:
            raise ValueError(f"delta must be > 0 and margin >= 0, got {self.delta}, {self.margin}")

    def __call__(self, q_hat: torch.Tensor, q: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
        """q_hat, q: (N,) scores and labels; pairs: (P, 2) indices (better, worse) into them.

        With no pairs in the batch the ranking term is zero (not NaN)."""
        regression = F.huber_loss(q_hat, q, delta=self.delta)
        if pairs.numel() == 0:
            return self.a * regression
        gaps = q_hat[pairs[:, 0]] - q_hat[pairs[:, 1]]
        ranking = torch.clamp(self.margin - gaps, min=0).mean()
        return self.a * regression + (1 - self.a) * ranking
