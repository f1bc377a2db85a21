"""Training, evaluating and shipping the scorer, on the judge's own labelled candidates."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from egrm.config import temperature_ladder
from egrm.engines.embedded.engine import EmbeddedEngine
from egrm.evals.data import builtin_arith
from egrm.pipeline.scorer import Candidate
from egrm.pipeline.service import RewardPipeline
from egrm.pipeline.types import JudgeOptions, PathMode
from egrm.scorer.features import ENGINE_SIGNALS
from egrm.scorer.heuristic import HeuristicScorer
from egrm.scorer.model import DEFAULT_CHECKPOINT, Checkpoint, TrainedScorer
from egrm.training.scorer_data import CapturingScorer, LabelledCandidates, generate, read
from egrm.training.scorer_train import (
    ScorerNet,
    TrainConfig,
    evaluate,
    mae,
    pairwise_accuracy,
    pick_accuracy,
    train,
    vote_accuracy,
)

ROOT = Path(__file__).resolve().parents[2]
TRAIN, TEST = ROOT / "data/scorer/train.jsonl", ROOT / "data/scorer/test.jsonl"


def _candidate(answer: str | None, agreement: float, mean_logprob: float = -1.0) -> Candidate:
    return Candidate("p", "r", "because", answer, mean_logprob, agreement, 40)


def test_the_numpy_forward_is_the_torch_network() -> None:
    checkpoint = train(read(TEST)[:20], TrainConfig(epochs=30))
    net = ScorerNet(len(checkpoint.features), checkpoint.hidden)
    shapes = {k: v.shape for k, v in net.state_dict().items()}
    net.load_state_dict({k: torch.tensor(v).reshape(shapes[k]) for k, v in checkpoint.state.items()})
    candidates = [c for item in read(TEST)[:10] for c in item.candidates]
    from egrm.scorer.features import vector

    x = torch.tensor([vector(c, checkpoint.features) for c in candidates])
    with torch.no_grad():
        expected = net(x).tolist()
    assert TrainedScorer(checkpoint).predict(candidates) == pytest.approx(expected, abs=1e-6)


def test_training_lowers_the_loss_and_the_checkpoint_round_trips(tmp_path: Path) -> None:
    checkpoint = train(read(TRAIN), TrainConfig(epochs=60))
    assert checkpoint.meta["final_loss"] < checkpoint.meta["first_loss"]
    assert checkpoint.meta["pairs"] > 0 and checkpoint.meta["config"]["loss"] == {"a": 0.7, "delta": 1.0, "margin": 0.1}
    path = checkpoint.save(tmp_path / "scorer.json")
    candidates = read(TEST)[0].candidates
    scores = TrainedScorer.load(path).predict(candidates)
    assert scores == TrainedScorer(checkpoint).predict(candidates)
    assert all(0 < s < 1 for s in scores)


def test_pairwise_accuracy_and_mae_by_hand() -> None:
    item = LabelledCandidates(
        "i", "easy", "Yes", [_candidate("Yes", 0.6), _candidate("No", 0.4), _candidate("Yes", 0.6)]
    )
    assert list(item.pairs()) == [(0, 1), (2, 1)]

    def by_agreement(cs):  # ranks both right ones above the wrong one
        return [c.agreement for c in cs]

    assert pairwise_accuracy([item], by_agreement) == 1.0
    assert pairwise_accuracy([item], lambda cs: [0.5] * len(cs)) == 0.5  # ties count half
    assert mae([item], lambda cs: [1.0, 0.5, 0.0]) == pytest.approx((0 + 0.5 + 1) / 3)


def test_pick_and_vote_accuracy_by_hand() -> None:
    split = LabelledCandidates("a", "easy", "Yes", [_candidate("No", 0), _candidate("Yes", 0), _candidate("No", 0)])
    sure = LabelledCandidates("b", "easy", "No", [_candidate("No", 0), _candidate("Yes", 0), _candidate("No", 0)])

    def second_best(cs):
        return [0.1, 0.9, 0.2][: len(cs)]

    assert pick_accuracy([split, sure], second_best) == 0.5  # right on a, picks the lone Yes on b
    assert pick_accuracy([split, sure], lambda cs: [0.0] * len(cs)) == 0.5  # a tie picks the first
    assert vote_accuracy([split, sure]) == 0.5  # the majority says No on both: wrong on a, right on b


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("not json", "not a scorer checkpoint"),
        ('{"features": ["agreement"], "hidden": 2, "state": {}}', "not a scorer checkpoint"),
        ('{"features": ["colour"], "hidden": 1, "state": %s}', "unknown features"),
    ],
)
def test_bad_checkpoints_are_refused(tmp_path: Path, body: str, message: str) -> None:
    if "%s" in body:
        zeros = {"mean": [0], "std": [1], "layers.0.weight": [0], "layers.0.bias": [0]}
        body = body % json.dumps({**zeros, "layers.2.weight": [0], "layers.2.bias": [0]})
    path = tmp_path / "scorer.json"
    path.write_text(body)
    with pytest.raises(ValueError, match=message):
        Checkpoint.load(path)


def test_eval_scorer_reports_the_shipped_checkpoint_against_its_baselines() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "egrm.cli", "eval-scorer", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["items"] == len(read(TEST)) and report["pairs"] == sum(1 for i in read(TEST) for _ in i.pairs())
    scorer = TrainedScorer.load(DEFAULT_CHECKPOINT)
    assert report["pairwise_accuracy"] == round(pairwise_accuracy(read(TEST), scorer.predict), 4)
    signals = report["signals"]
    assert set(signals) == {*ENGINE_SIGNALS, "slips"}  # every engine signal alone, and the reading
    assert report["baseline_pairwise_accuracy"] == max(signals[n]["pairwise_accuracy"] for n in ENGINE_SIGNALS)
    for figures in [report, report["heuristic"], *signals.values()]:  # each with its 95% interval
        for name in ("pairwise", "pick"):
            low, high = figures[f"{name}_ci95"]
            assert low <= figures[f"{name}_accuracy"] <= high
    assert report["pick_accuracy"] == round(pick_accuracy(read(TEST), scorer.predict), 4)
    assert report["vote_accuracy"] == round(vote_accuracy(read(TEST)), 4)
    assert max(report["pick_accuracy"], report["vote_accuracy"]) <= report["oracle_accuracy"] <= 1
    assert 0 <= report["mae"] <= 1


def test_the_shipped_checkpoint_is_what_train_scorer_makes_of_the_shipped_data() -> None:
    shipped = TrainedScorer.load(DEFAULT_CHECKPOINT)
    retrained = TrainedScorer(train(read(TRAIN), TrainConfig()))
    candidates = [c for item in read(TEST) for c in item.candidates]
    assert retrained.predict(candidates) == pytest.approx(shipped.predict(candidates), abs=1e-3)
    assert shipped.checkpoint.meta["candidates"] == 5 * len(read(TRAIN))


def _signal_items(n: int, seed: int) -> list[LabelledCandidates]:
    """Items whose right candidates have the higher final log-prob, under noise in every feature."""
    rng = np.random.default_rng(seed)
    items = []
    for k in range(n):
        candidates = []
        for i in range(5):
            right = i % 2 == 0
            answer = "Yes" if right else "No"
            final = -0.5 - rng.exponential(0.5) if right else -1.5 - rng.exponential(0.5)
            c = Candidate(
                "p", "r", "t", answer, float(rng.normal(-1, 0.3)), float(rng.uniform()), int(rng.integers(20, 90))
            )
            candidates.append(dataclasses.replace(c, final_logprob=final, min_logprob=float(-rng.exponential(3))))
        items.append(LabelledCandidates(f"s{k}", "easy", "Yes", candidates))
    return items


def test_the_recipe_learns_a_signal_when_the_candidates_carry_one() -> None:
    train_items, test_items = _signal_items(40, 0), _signal_items(40, 1)
    report = evaluate(train(train_items, TrainConfig()), train_items, test_items)
    assert report["pairwise_accuracy"] > 0.9 and report["signals"]["mean_logprob"]["pairwise_accuracy"] < 0.7
    assert report["baseline"] == "final_logprob"  # the one signal the candidates carry
    assert report["mae"] < 0.3


def test_train_scorer_cli_writes_a_checkpoint(tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "egrm.cli", "train-scorer", "--data", str(TEST), "--out", str(tmp_path)]
    done = subprocess.run([*cli, "--epochs", "20", "--a", "0.5"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["checkpoint"] == str(tmp_path / "scorer.json") and out["candidates"] == 5 * len(read(TEST))
    assert Checkpoint.load(tmp_path / "scorer.json").meta["config"]["loss"]["a"] == 0.5
    assert "train-scorer" in done.stderr  # the progress bar


@pytest.mark.slow
def test_make_scorer_data_labels_real_candidates_and_resumes(engine: EmbeddedEngine, tmp_path: Path) -> None:
    items = builtin_arith("test")[:2]
    options = JudgeOptions(temperature_ladder(5), 0.95, 0.8, PathMode.LONG, "verdict", seed=3, long_max_tokens=6)
    out = tmp_path / "data.jsonl"
    pipeline = RewardPipeline(engine, CapturingScorer(HeuristicScorer()))
    assert asyncio.run(generate(pipeline, items, options, out)) == 2
    rows = read(out)
    assert [r.id for r in rows] == [i.id for i in items] and [r.gold for r in rows] == [i.gold for i in items]
    for row in rows:
        assert len(row.candidates) == 5
        assert row.quality() == [1.0 if c.answer == row.gold else 0.0 for c in row.candidates]
        for c in row.candidates:
            assert max(c.min_logprob, c.mean_logprob, c.final_logprob) <= 0 and c.tokens > 0
    assert asyncio.run(generate(pipeline, items, options, out)) == 0  # all done: nothing redone
    out.write_text(out.read_text()[:-20])  # a crash cut the last line short
    assert asyncio.run(generate(pipeline, items, options, out)) == 1
    assert [r.id for r in read(out)] == [i.id for i in items]


def test_long_path_candidates_carry_the_new_signals() -> None:
    fields = {f.name for f in dataclasses.fields(Candidate)}
    assert {"min_logprob", "final_logprob", "finished"} <= fields
    assert np.isfinite(TrainedScorer.load().predict([_candidate("Yes", 1.0)])[0])
