"""One model thread, a bounded queue, and batching of whatever is waiting.

Why one thread for ALL torch work, loading included: torch's CPU kernels use OpenMP (libgomp),
and every OS thread that runs a parallel region gets its own team of worker threads. Once
more OpenMP threads exist than cores, libgomp stops spin-waiting between regions, and on two
cores the many small regions of a decode step then ran 1.6x slower (measured: 0.51 s vs
0.81 s for one 16-token sample). So the model is loaded, run and benchmarked on this thread.

Concurrent requests do not run one after another: when the model thread is free it takes every
job that has queued up meanwhile (up to a branch budget), prefills all their prefixes in one
forward and decodes all their branches in the same steps. Continuations of branches that live
in the same fork are merged the same way. Jobs whose caller has gone away are skipped.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from app.engines.base import BranchParams, EngineBusyError

log = logging.getLogger(__name__)


@dataclass(slots=True, kw_only=True)
class _ModelWork:
    """What every model job carries besides its inputs."""

    future: Future = field(default_factory=Future)
    # Set when the caller stops waiting (client gone, deadline): the decode loop drops the
    # job's branches at the next step instead of finishing them.
    abandoned: threading.Event = field(default_factory=threading.Event)


@dataclass(slots=True)
class SampleJob(_ModelWork):
    ids: list[int]
    params: list[BranchParams]

    @property
    def branches(self) -> int:
        return len(self.params)

    @property
    def tokens(self) -> int:
        """Tokens its admission prefills (the prefix, once for all its branches)."""
        return len(self.ids)


@dataclass(slots=True)
class ContinueJob(_ModelWork):
    fork: Any
    rows: list[int]
    ids: list[int]  # what to append to each row before decoding
    params: list[BranchParams]

    @property
    def branches(self) -> int:
        return len(self.params)

    @property
    def tokens(self) -> int:
        return len(self.ids) * len(self.rows)


@dataclass(slots=True)
class CallJob:
    """Any other work that must run on the model thread (loading, benchmarks' reference runs)."""

    fn: Callable[[], Any]
    future: Future = field(default_factory=Future)
    branches: int = 0
    tokens: int = 0


Job = SampleJob | ContinueJob | CallJob
ModelJob = SampleJob | ContinueJob
R = TypeVar("R")  # the engine's round: jobs admitted together, in progress


class Scheduler(Generic[R]):
    """start(jobs) opens rounds for admitted jobs; advance(rounds) runs one step of each and
    returns those still going. Both run on this scheduler's thread only."""

    def __init__(
        self,
        start: Callable[[Sequence[ModelJob]], list[R]],
        advance: Callable[[list[R]], list[R]],
        max_queue: int,
        max_batch_branches: int,
        window_ms: float = 5.0,
        max_batch_tokens: int = 2048,
    ):
        self._start, self._advance = start, advance
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._max_queue = max_queue
        self._max_branches = max_batch_branches
        # The prompt tokens one admission may prefill: its forward cannot be interrupted, so this
        # bounds how long a deadline, a disconnect or a small request waits behind big prompts,
        # and the activations of that forward (a lone bigger prompt is still admitted, alone).
        self._max_tokens = max_batch_tokens
        self._window_s = window_ms / 1000
        self._last_size = 1  # jobs in the last batch
        self._carry: list[Job] = []  # jobs that did not fit the last batch, oldest first
        self._thread = threading.Thread(target=self._loop, name="egrm-engine", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        return self._queue.qsize() + len(self._carry)

    def submit(self, job: Job) -> Future:
        if self.depth >= self._max_queue:
            raise EngineBusyError(f"engine queue is full ({self._max_queue} jobs waiting)")
        self._queue.put(job)
        return job.future

    def call(self, fn: Callable[[], Any]) -> Future:
        """Run fn on the model thread; its result (or exception) arrives in the future."""
        return self.submit(CallJob(fn))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=60)

    def _next_batch(self, block: bool) -> list[Job] | None:
        """The jobs to admit now: [] when none wait (and not blocking), None when closing.

        Jobs that do not fit the budgets wait in `_carry`, in order, and the oldest of them opens
        the next batch (so a big job is never starved); younger jobs that do fit go ahead of them,
        so a small request is not queued behind every big prompt admitted before it.
        """
        waiting, self._carry = self._carry, []
        if waiting:
            first: Job | None = waiting.pop(0)
        elif block:
            first = self._queue.get()
        else:
            try:
                first = self._queue.get_nowait()
            except queue.Empty:
                return []
        if first is None:
            return None
        batch, branches, tokens = [first], first.branches, first.tokens
        # Under concurrency, replies to the last batch come back as new requests a few ms apart;
        # starting on the first one alone would split the load into one small and one large batch.
        # So while the last batch was shared, an idle engine waits up to the window for one more
        # job than it had. A lone client (last batch of one) never waits; a busy engine neither.
        deadline = time.monotonic() + self._window_s if block and self._last_size > 1 else 0.0
        while True:
            if waiting:
                job: Job | None = waiting.pop(0)
            else:
                try:
                    wait = deadline - time.monotonic()
                    job = (
                        self._queue.get(timeout=wait)
                        if wait > 0 and len(batch) <= self._last_size
                        else self._queue.get_nowait()
                    )
                except queue.Empty:
                    break
            if job is None:  # closing: admit this batch, then stop
                self._queue.put(None)
                break
            if branches + job.branches > self._max_branches or tokens + job.tokens > self._max_tokens:
                self._carry.append(job)
                continue
            batch.append(job)
            branches += job.branches
            tokens += job.tokens
        self._carry += waiting
        self._last_size = len(batch)
        return batch

    def _loop(self) -> None:
        """Admit waiting jobs, then advance every running round by one forward; repeat.

        A round holds the jobs admitted together (one fork): continuous batching at the
        granularity of rounds, so a short request never waits for a long one to finish.
        """
        rounds: list[R] = []
        closing = False
        while True:
            if not closing:
                batch = self._next_batch(block=not rounds)
                if batch is None:
                    closing = True
                else:
                    rounds += self._admit(batch)
            if closing and not rounds:
                return
            if rounds:
                try:
                    rounds = self._advance(rounds)
                except BaseException:  # the engine settles its rounds' jobs; never lose the thread
                    log.exception("engine step failed")
                    rounds = []

    def _admit(self, batch: list[Job]) -> list[R]:
        live = [j for j in batch if j.future.set_running_or_notify_cancel()]
        for call in (j for j in live if isinstance(j, CallJob)):
            try:
                call.future.set_result(call.fn())
            except BaseException as exc:
                call.future.set_exception(exc)
        model_jobs = [j for j in live if not isinstance(j, CallJob)]
        if not model_jobs:
            return []
        try:
            return self._start(model_jobs)
        except BaseException as exc:
            log.exception("engine batch failed to start")
            fail_jobs(model_jobs, exc)
            return []


def fail_jobs(jobs: Sequence[ModelJob], exc: BaseException) -> None:
    """Tell every caller still waiting that its job failed."""
    for job in jobs:
        if not job.future.done():
            job.future.set_exception(exc)
