"""Scorer training data: the judge's own long-path candidates on items with exact labels.

Each item runs the real long path once; a capturing scorer records the candidates exactly as a
scorer receives them in production. A candidate's quality q is 1 when the result its reasoning
reached is the question's true result, else 0; preference pairs (r+, r-) are a right and a
wrong candidate of the same item.
One JSON line per item; writing appends and skips ids already there, so a stopped run resumes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from egrm.evals.data import LabelledItem
from egrm.pipeline.scorer import Candidate, Scorer
from egrm.pipeline.service import RewardPipeline
from egrm.pipeline.types import JudgeOptions, PathMode


class CapturingScorer:
    """Scores with `inner` and keeps the last batch of candidates it was given."""

    def __init__(self, inner: Scorer):
        self.inner = inner
        self.last: list[Candidate] = []

    @property
    def calibrated(self) -> bool:
        return self.inner.calibrated

    async def score(self, candidates: Sequence[Candidate]) -> list[float]:
        self.last = list(candidates)
        return await self.inner.score(candidates)

    async def ready(self) -> bool:
        return await self.inner.ready()

    async def close(self) -> None:
        await self.inner.close()


@dataclass(slots=True)
class LabelledCandidates:
    id: str
    difficulty: str
    gold: str  # the item's verdict
    candidates: list[Candidate]
    truth: str | None = None  # the question's result, as the verifier writes it ("2756")

    @property
    def target(self) -> str:
        """The right answer for a candidate: the true result (older files: the gold verdict)."""
        return self.truth if self.truth is not None else self.gold

    def quality(self) -> list[float]:
        return [1.0 if c.answer == self.target else 0.0 for c in self.candidates]

    def pairs(self) -> Iterator[tuple[int, int]]:
        """(better, worse) index pairs: every right candidate against every wrong one."""
        q = self.quality()
        return ((i, j) for i, qi in enumerate(q) for j, qj in enumerate(q) if qi > qj)

    def to_json(self) -> str:
        body = {"id": self.id, "difficulty": self.difficulty, "gold": self.gold, "truth": self.truth}
        return json.dumps({**body, "candidates": [asdict(c) for c in self.candidates]})

    @classmethod
    def from_json(cls, line: str) -> LabelledCandidates:
        raw = json.loads(line)
        candidates = [Candidate(**c) for c in raw["candidates"]]
        return cls(raw["id"], raw["difficulty"], raw["gold"], candidates, raw.get("truth"))


def read(path: Path) -> list[LabelledCandidates]:
    try:
        return [LabelledCandidates.from_json(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not scorer data ({exc!r})") from exc


def done_ids(path: Path) -> set[str]:
    """Ids already written; a last line cut short by a crash is dropped so it is redone."""
    if not path.exists():
        return set()
    lines = path.read_text().splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        path.write_text("".join(lines[:-1]))
        lines = lines[:-1]
    return {json.loads(line)["id"] for line in lines if line.strip()}


async def generate(
    pipeline: RewardPipeline,
    items: Sequence[LabelledItem],
    options: JudgeOptions,
    out: Path,
    progress: Callable[[], None] = lambda: None,
) -> int:
    """Append one line per item not yet in `out`; returns how many were written. The pipeline's
    scorer is a CapturingScorer: what it was given for an item is that item's candidates."""
    if options.path is not PathMode.LONG:
        raise ValueError("scorer data comes from the long path")
    capture = pipeline.scorer
    if not isinstance(capture, CapturingScorer):
        raise ValueError("scorer data needs a pipeline whose scorer is a CapturingScorer")
    skip = done_ids(out)
    written = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as sink:
        for index, item in enumerate(items):
            if item.id in skip:
                progress()
                continue
            seeded = replace(options, seed=(options.seed or 0) + 10_000 * index)
            await pipeline.score_item(item.judge_item(), seeded)
            truth = None if item.truth is None else str(item.truth)
            labelled = LabelledCandidates(item.id, item.difficulty, item.gold, capture.last, truth)
            sink.write(labelled.to_json() + "\n")
            sink.flush()
            os.fsync(sink.fileno())
            written += 1
            progress()
    return written


def make_data(out_dir: Path, train: int, test: int, long_max_tokens: int, seed: int) -> dict[str, int]:
    """`egrm make-scorer-data`: builtin:arith-mixed train items -> train.jsonl, test items -> test.jsonl."""
    import asyncio
    import sys

    from tqdm import tqdm

    from egrm.config import Settings, temperature_ladder
    from egrm.evals.data import builtin_arith
    from egrm.evals.runner import take
    from egrm.factory import build_scorer, pipeline_from

    settings = Settings()
    options = JudgeOptions(
        temperatures=temperature_ladder(settings.m),
        top_p=settings.top_p,
        tau=settings.tau,
        path=PathMode.LONG,
        template="verdict",
        seed=seed,
        long_max_tokens=long_max_tokens,
    )
    counts = {}
    # Every item's own candidates: no work shared between items (their seeds differ anyway).
    settings = settings.model_copy(update={"share_questions": False})
    capture = CapturingScorer(build_scorer(settings))

    async def go() -> None:
        async with pipeline_from(settings, scorer=capture) as pipeline:
            for split, n in (("test", test), ("train", train)):
                items = take(builtin_arith(split, mixed_forms=True), n)
                with tqdm(total=len(items), desc=f"scorer data {split}", file=sys.stderr, unit="item") as bar:
                    out = out_dir / f"{split}.jsonl"
                    await generate(pipeline, items, options, out, progress=lambda: bar.update(1))
                    counts[split] = len(read(out))
        await capture.close()

    asyncio.run(go())
    return counts
