"""Rounds: the jobs the model thread admitted together, advanced one forward at a time.

A round is a generator. It yields (fork, feed) -- what to append to which rows -- and receives
that forward's logits. The engine runs one forward per fork for all rounds waiting on it, so a
continuation that arrives while another is decoding on the same fork shares its steps.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from app.engines.embedded.decoder import Feed, RowRun
from app.engines.embedded.fork import ForkState
from app.engines.embedded.packed import PackedFork
from app.engines.embedded.scheduler import ContinueJob, Job, ModelJob, SampleJob, fail_jobs

Fork = ForkState | PackedFork
log = logging.getLogger(__name__)

# A round's generator: it yields (fork, feed) for a forward and receives that forward's logits.
Steps = Generator[tuple[Fork, Feed], torch.Tensor, None]


@dataclass(slots=True)
class Round:
    """Jobs admitted together, their generator, and the forward it waits for."""

    steps: Steps
    jobs: list[ModelJob]
    fork: Any = None
    feed: Feed = field(default_factory=list)

    def resume(self, logits: torch.Tensor | None) -> bool:
        """Run to the next forward request; False once finished (or failed: its jobs are told)."""
        try:
            self.fork, self.feed = next(self.steps) if logits is None else self.steps.send(logits)
            return True
        except StopIteration:
            return False
        except Exception as exc:
            log.exception("engine round failed")
            self.fail(exc)
            return False

    def fail(self, exc: BaseException) -> None:
        fail_jobs(self.jobs, exc)


def on_fork(
    fork: Fork, steps: Generator[Feed, torch.Tensor, list[RowRun]]
) -> Generator[tuple[Fork, Feed], torch.Tensor, list[RowRun]]:
    """Tag each feed of a decode loop with its fork."""
    try:
        feed = next(steps)
        while True:
            feed = steps.send((yield fork, feed))
    except StopIteration as done:
        return done.value


def abandoned_rows(jobs: Sequence[SampleJob] | Sequence[ContinueJob]) -> Callable[[], set[int]]:
    """Positions (in the order decode() got its rows) of branches whose caller has gone."""

    def positions() -> set[int]:
        gone: set[int] = set()
        start = 0
        for job in jobs:
            if job.abandoned.is_set():
                gone.update(range(start, start + job.branches))
            start += job.branches
        return gone

    return positions


def split_runs(runs: list[RowRun], jobs: Sequence[Job]) -> list[list[RowRun]]:
    out, start = [], 0
    for job in jobs:
        out.append(runs[start : start + job.branches])
        start += job.branches
    return out
