"""Train and evaluate the scorer: the hybrid loss over labelled long-path candidates.

Training is full-batch Adam on a few thousand candidates (seconds on a CPU); the network
(train-time torch twin of model.TrainedScorer) is standardised on the training features so
log-probs and shares weigh alike from the first step.
"""

from __future__ import annotations

import random
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from egrm.pipeline.consensus import tally
from egrm.pipeline.judgement import vote_weights, weighted_vote
from egrm.pipeline.scorer import Candidate
from egrm.scorer.features import ENGINE_SIGNALS, FEATURES, vector
from egrm.scorer.model import CHECKPOINT_NAME, Checkpoint, TrainedScorer
from egrm.training.loss import HybridLoss
from egrm.training.scorer_data import LabelledCandidates

# Feature groups for the ablation: what each kind of signal is worth on its own and in a team.
ABLATION: dict[str, tuple[str, ...]] = {
    "agreement": ("agreement",),
    "logprobs": ("mean_logprob", "min_logprob", "final_logprob"),
    "length+finished": ("length", "finished", "answered"),
    "reading": ("slips", "checked"),
    "engine signals": tuple(f for f in FEATURES if f not in ("slips", "checked")),
    "all-but-agreement": tuple(f for f in FEATURES if f != "agreement"),
    "all": tuple(FEATURES),
}

ScoreFn = Callable[[Sequence[Candidate]], list[float]]


class ScorerNet(nn.Module):
    """Standardised features -> tanh hidden layer -> quality in (0, 1); see model.PARAMS."""

    def __init__(self, n_features: int, hidden: int):
        super().__init__()
        self.mean: torch.Tensor
        self.std: torch.Tensor
        self.register_buffer("mean", torch.zeros(n_features))
        self.register_buffer("std", torch.ones(n_features))
        self.layers = nn.Sequential(nn.Linear(n_features, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.layers((x - self.mean) / self.std)).squeeze(-1)


@dataclass(frozen=True, slots=True)
class TrainConfig:
    features: tuple[str, ...] = tuple(FEATURES)
    hidden: int = 16
    epochs: int = 400
    lr: float = 0.01
    weight_decay: float = 1e-3
    seed: int = 0
    loss: HybridLoss = HybridLoss()


def _tensors(items: Sequence[LabelledCandidates], features: tuple[str, ...]) -> tuple[torch.Tensor, ...]:
    rows: list[list[float]] = []
    labels: list[float] = []
    pairs: list[tuple[int, int]] = []
    for item in items:
        base = len(rows)
        rows += [vector(c, features) for c in item.candidates]
        labels += item.quality()
        pairs += [(base + i, base + j) for i, j in item.pairs()]
    x = torch.tensor(rows, dtype=torch.float32)
    return x, torch.tensor(labels, dtype=torch.float32), torch.tensor(pairs, dtype=torch.long).reshape(-1, 2)


def train(items: Sequence[LabelledCandidates], config: TrainConfig, progress: bool = False) -> Checkpoint:
    torch.manual_seed(config.seed)
    x, q, pairs = _tensors(items, config.features)
    net = ScorerNet(len(config.features), config.hidden)
    with torch.no_grad():
        net.mean.copy_(x.mean(0))
        net.std.copy_(x.std(0).clamp_min(1e-3))  # a constant feature must not divide by zero
    optimiser = torch.optim.Adam(net.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    losses = []
    steps = tqdm(range(config.epochs), desc="train-scorer", file=sys.stderr, disable=not progress)
    for _ in steps:
        optimiser.zero_grad()
        loss = config.loss(net(x), q, pairs)
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
        steps.set_postfix(loss=f"{losses[-1]:.4f}", refresh=False)
    state = {k: [round(v, 7) for v in t.flatten().tolist()] for k, t in net.state_dict().items()}
    meta = {
        "candidates": len(q),
        "pairs": len(pairs),
        "first_loss": round(losses[0], 5),
        "final_loss": round(losses[-1], 5),
        "config": {**asdict(config), "loss": asdict(config.loss)},
    }
    return Checkpoint(config.features, config.hidden, state, meta)


def _pair_outcomes(item: LabelledCandidates, s: Sequence[float]) -> list[float]:
    """Each (right, wrong) pair of the item: 1 ranked right, 0 wrong, a tie half."""
    return [1.0 if s[i] > s[j] else 0.5 if s[i] == s[j] else 0.0 for i, j in item.pairs()]


def _picks_right(item: LabelledCandidates, s: Sequence[float], weighs: bool = True) -> bool:
    """Whether the item's long-path answer is right: the candidates' results, each weighted by its
    score and voted as the pipeline votes them (weighs); or a raw signal's best candidate's result."""
    answers = [c.answer for c in item.candidates]
    pick = weighted_vote(answers, vote_weights(s)) if weighs else answers[max(range(len(s)), key=s.__getitem__)]
    return pick == item.target


def _vote_right(item: LabelledCandidates) -> bool:
    """Whether the candidates' plain majority is the right answer."""
    return tally([c.answer for c in item.candidates]).majority == item.target


def pairwise_accuracy(items: Sequence[LabelledCandidates], score: ScoreFn) -> float:
    """Share of (right, wrong) candidate pairs of the same item ranked right; ties count half."""
    wins = [w for item in items for w in _pair_outcomes(item, score(item.candidates))]
    return statistics.fmean(wins) if wins else float("nan")


def pick_accuracy(items: Sequence[LabelledCandidates], score: ScoreFn) -> float:
    """Share of items whose long-path answer is right (see _picks_right)."""
    picks = [_picks_right(item, score(item.candidates)) for item in items]
    return statistics.fmean(picks) if picks else float("nan")


def vote_accuracy(items: Sequence[LabelledCandidates]) -> float:
    """Share of items whose candidates' majority answer is the right one: the long path without a
    scorer (what it falls back to when the scorer fails)."""
    return statistics.fmean(_vote_right(item) for item in items)


def mae(items: Sequence[LabelledCandidates], score: ScoreFn) -> float:
    errors = [abs(a - b) for item in items for a, b in zip(score(item.candidates), item.quality(), strict=True)]
    return statistics.fmean(errors)


def by_feature(name: str, sign: float) -> ScoreFn:
    """A one-signal baseline: rank candidates by a raw feature (higher is better when sign > 0)."""
    return lambda candidates: [sign * vector(c, (name,))[0] for c in candidates]


def best_sign(items: Sequence[LabelledCandidates], name: str) -> float:
    """The direction of a baseline feature that ranks the training pairs better (fair to it)."""
    return max((1.0, -1.0), key=lambda sign: pairwise_accuracy(items, by_feature(name, sign)))


@dataclass(frozen=True, slots=True)
class PerItem:
    """One ranking's outcome on each held-out item: what the bootstrap resamples."""

    wins: np.ndarray  # per item: right-over-wrong pairs ranked right (ties half)
    pairs: np.ndarray  # per item: right-vs-wrong pairs
    picks: np.ndarray  # per item: 1 if the score-weighted vote reaches the true result

    @classmethod
    def of(cls, items: Sequence[LabelledCandidates], score: ScoreFn, weighs: bool = True) -> PerItem:
        """weighs: the scores are in [0, 1] and weigh the vote, as the pipeline's scorer does; a raw
        signal (a log-prob, a length) instead picks its best candidate's answer."""
        wins, pairs, picks = [], [], []
        for item in items:
            s = score(item.candidates)
            outcome = _pair_outcomes(item, s)
            wins.append(sum(outcome))
            pairs.append(len(outcome))
            picks.append(float(_picks_right(item, s, weighs)))
        return cls(np.array(wins), np.array(pairs), np.array(picks))

    def report(self, resamples: np.ndarray) -> dict[str, Any]:
        """Pairwise and pick accuracy, each with a 95% interval over items resampled with replacement."""
        pairwise = self.wins[resamples].sum(1) / np.maximum(self.pairs[resamples].sum(1), 1)
        picks = self.picks[resamples].mean(1)
        return {
            "pairwise_accuracy": round(float(self.wins.sum() / max(self.pairs.sum(), 1)), 4),
            "pairwise_ci95": [round(float(v), 4) for v in np.percentile(pairwise, [2.5, 97.5])],
            "pick_accuracy": round(float(self.picks.mean()), 4),
            "pick_ci95": [round(float(v), 4) for v in np.percentile(picks, [2.5, 97.5])],
        }


BOOTSTRAP = 2000


def evaluate(
    checkpoint: Checkpoint, train_items: Sequence[LabelledCandidates], test_items: Sequence[LabelledCandidates]
) -> dict[str, Any]:
    """Held-out figures of the trained scorer beside every single signal (the engine's, each in the
    direction that ranks the training pairs better, and the reading's), the heuristic, the vote and
    the oracle; each with a 95% bootstrap interval over items."""
    scorer = TrainedScorer(checkpoint)
    resamples = np.random.default_rng(0).integers(0, len(test_items), size=(BOOTSTRAP, len(test_items)))
    singles = {
        name: PerItem.of(test_items, by_feature(name, best_sign(train_items, name)), weighs=False).report(resamples)
        for name in (*ENGINE_SIGNALS, "slips")
    }
    best = max(ENGINE_SIGNALS, key=lambda name: singles[name]["pairwise_accuracy"])
    ours = PerItem.of(test_items, scorer.predict).report(resamples)
    votes = np.array([float(_vote_right(item)) for item in test_items])
    return {
        "items": len(test_items),
        "pairs": sum(1 for item in test_items for _ in item.pairs()),
        **ours,
        "mae": round(mae(test_items, scorer.predict), 4),
        # The best of the engine's signals alone (the reading's is in `signals` too).
        "baseline_pairwise_accuracy": singles[best]["pairwise_accuracy"],
        "baseline": best,
        "signals": singles,
        "heuristic": PerItem.of(test_items, _heuristic).report(resamples),
        "vote_accuracy": round(float(votes.mean()), 4),
        "vote_ci95": [round(float(v), 4) for v in np.percentile(votes[resamples].mean(1), [2.5, 97.5])],
        "oracle_accuracy": round(statistics.fmean(any(q for q in i.quality()) for i in test_items), 4),
    }


def _heuristic(candidates: Sequence[Candidate]) -> list[float]:
    from egrm.scorer.heuristic import HeuristicScorer

    return [HeuristicScorer._one(c) for c in candidates]


def ablation(
    train_items: Sequence[LabelledCandidates], test_items: Sequence[LabelledCandidates], config: TrainConfig
) -> dict[str, float]:
    """Held-out pairwise accuracy of the same recipe trained on each feature group."""
    out = {}
    for group, features in ABLATION.items():
        checkpoint = train(train_items, TrainConfig(**{**asdict(config), "features": features, "loss": config.loss}))
        out[group] = round(pairwise_accuracy(test_items, TrainedScorer(checkpoint).predict), 4)
    return out


def seeds_spread(train_items: Sequence[LabelledCandidates], test_items: Sequence[LabelledCandidates]) -> list[float]:
    """Held-out pairwise accuracy over a few training seeds: how much of a gap is luck."""
    return [
        round(pairwise_accuracy(test_items, TrainedScorer(train(train_items, TrainConfig(seed=s))).predict), 4)
        for s in random.Random(0).sample(range(1000), 3)
    ]


def save_to(out: Path, checkpoint: Checkpoint) -> Path:
    """`--out DIR` writes DIR/scorer.json; a path ending in .json is written as is."""
    return checkpoint.save(out if out.suffix == ".json" else out / CHECKPOINT_NAME)
