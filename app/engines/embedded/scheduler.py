"""One model thread, a bounded queue, and batching of whatever is waiting.

Concurrent requests do not run one after another: when the model thread is free it takes every
job that has queued up meanwhile (up to a branch budget), prefills all their prefixes in one
forward and decodes all their branches in the same steps. Continuations of branches that live
in the same fork are merged the same way. Jobs whose caller has gone away are skipped.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from app.engines.base import BranchParams

log = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """More jobs are waiting than the queue admits; the caller should retry later."""


@dataclass(slots=True)
class SampleJob:
    ids: list[int]
    params: list[BranchParams]
    future: Future = field(default_factory=Future)

    @property
    def branches(self) -> int:
        return len(self.params)


@dataclass(slots=True)
class ContinueJob:
    fork: Any
    rows: list[int]
    text: str
    params: list[BranchParams]
    future: Future = field(default_factory=Future)

    @property
    def branches(self) -> int:
        return len(self.params)


Job = SampleJob | ContinueJob
Runner = Callable[[Sequence[Job]], None]


class Scheduler:
    def __init__(self, run_batch: Runner, max_queue: int, max_batch_branches: int):
        self._run_batch = run_batch
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._max_queue = max_queue
        self._max_branches = max_batch_branches
        self._carry: Job | None = None  # a job that did not fit the last batch goes first next
        self._thread = threading.Thread(target=self._loop, name="egrm-engine", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        return self._queue.qsize()

    def submit(self, job: Job) -> Future:
        if self._queue.qsize() >= self._max_queue:
            raise QueueFullError(f"engine queue is full ({self._max_queue} jobs waiting)")
        self._queue.put(job)
        return job.future

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=60)

    def _next_batch(self) -> list[Job] | None:
        first = self._carry or self._queue.get()
        self._carry = None
        if first is None:
            return None
        batch, branches = [first], first.branches
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:  # closing: finish this batch, then stop
                self._queue.put(None)
                break
            if branches + job.branches > self._max_branches:
                self._carry = job
                break
            batch.append(job)
            branches += job.branches
        return batch

    def _loop(self) -> None:
        while (batch := self._next_batch()) is not None:
            live = [j for j in batch if j.future.set_running_or_notify_cancel()]
            if not live:
                continue
            try:
                self._run_batch(live)
            except BaseException as exc:  # keep the thread alive; fail this batch's callers only
                log.exception("engine batch failed")
                for job in live:
                    if not job.future.done():
                        job.future.set_exception(exc)
