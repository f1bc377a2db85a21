"""The embedded engine: an in-process torch model behind the async Engine contract.

This is the async front (vLLM's AsyncLLM to its EngineCore): it owns the model thread, the inbox
and the callers' futures. The thread runs the synchronous core (core.py) `while there is work:
step()`; requests only put jobs (and aborts, and released branches) in the inbox and await
futures, so the event loop never blocks, and every future is answered here.

Why one thread for ALL torch work, loading included: torch's CPU kernels use OpenMP (libgomp),
and every OS thread that runs a parallel region gets its own team of worker threads. Once more
OpenMP threads exist than cores, libgomp stops spin-waiting between regions, and on two cores
the many small regions of a decode step then ran 1.6x slower (measured: 0.51 s vs 0.81 s for one
16-token sample). So the model is loaded, run and benchmarked on this thread.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from typing import Any

from egrm.engines.base import (
    Branch,
    BranchParams,
    ContextLengthError,
    EngineBusyError,
    EngineStats,
    RequestTooLargeError,
    appended_ids,
)
from egrm.engines.chat import chat_ids
from egrm.engines.embedded.core import EngineCore
from egrm.engines.embedded.kv_cache import BLOCK_SIZE
from egrm.engines.embedded.loader import LoadedModel, load_model
from egrm.engines.embedded.memory import retain_freed_memory
from egrm.engines.embedded.model_runner import Layout, LeanRunner
from egrm.engines.embedded.sequence import Handle, Job
from egrm.engines.embedded.sequence import Sequence as Seq

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Call:
    """Other work for the model thread (loading, benchmarks' reference runs)."""

    fn: Callable[[], Any]
    future: Future = field(default_factory=Future)


@dataclass(frozen=True, slots=True)
class _Abort:
    """The caller of a job stopped waiting (its deadline, its client gone)."""

    job: Job


@dataclass(frozen=True, slots=True)
class _Release:
    """Nobody will continue this branch (released by the caller, or its handle collected)."""

    seq: Seq
    collected: bool = False  # by the garbage collector: the safety net, counted


class EmbeddedEngine:
    def __init__(
        self,
        model: LoadedModel | Callable[[], LoadedModel],
        layout: Layout | str = Layout.SEQUENCE,
        lean: bool | None = None,
        max_queue: int = 1024,
        max_batch_branches: int = 128,
        prefix_cache: bool = True,
        batch_window_ms: float = 5.0,
        max_batch_tokens: int = 512,
        kv_cache_mb: float = 1024,
    ):
        """model: a loaded model, or a loader to call on the model thread.

        lean: None = the lean forward where the architecture allows it; False = always generic.
        prefix_cache: reuse the KV of prompt heads that requests share (lean forward only).
        max_batch_branches: most sequences running at once; max_batch_tokens: most tokens one step
        computes; kv_cache_mb: the KV pool, preallocated.
        """
        self._layout = Layout(layout)
        self._max_queue = max_queue
        self._window_s = batch_window_ms / 1000
        self._last_jobs = 1  # most jobs in flight at once during the last busy spell
        self._inbox: queue.Queue[Job | _Abort | _Release | _Call | None] = queue.Queue()  # None: close
        # Work (jobs, calls) put in the inbox and taken out, each counter written by one thread only:
        # the inbox also carries releases and aborts, which are no load, so its size is not the queue.
        self._submitted = self._taken = 0
        self._submitting = threading.Lock()  # callers on several threads put work in
        self._core: EngineCore | None = None
        retain_freed_memory()  # before the model thread's first allocation (its arena): see memory.py
        self._thread = threading.Thread(target=self._loop, name="egrm-engine", daemon=True)
        self._thread.start()

        def setup() -> None:
            loaded = model if isinstance(model, LoadedModel) else model()
            self._core = EngineCore(
                loaded, self._layout, lean, prefix_cache, max_batch_branches, max_batch_tokens, kv_cache_mb
            )

        try:
            self.run_on_model_thread(setup)
        except BaseException:
            self._close()
            raise

    @property
    def core(self) -> EngineCore:
        assert self._core is not None, "the engine is set up in its constructor"
        return self._core

    @classmethod
    def load(
        cls,
        path: str,
        dtype: str = "auto",
        threads: int = 0,
        device: str = "cpu",
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> EmbeddedEngine:
        return cls(lambda: load_model(path, dtype, threads, device, chat_template), **kwargs)

    def call(self, fn: Callable[[], Any]) -> Future:
        """Run fn on the model thread, between steps; its result (or exception) comes in the future."""
        call = _Call(fn)
        self._put_work(call)
        return call.future

    def run_on_model_thread(self, fn: Callable[[], Any]) -> Any:
        """Run fn where the model runs, and wait (blocking): for benchmarks and tools, not requests."""
        return self.call(fn).result()

    # --- what it is ------------------------------------------------------------------------

    @property
    def model_name(self) -> str:
        return self.core.model.name

    @property
    def dtype(self) -> str:
        """The weights' and compute dtype, e.g. "float32" ("auto" resolved at load)."""
        return str(self.core.model.model.dtype).removeprefix("torch.")

    @property
    def layout(self) -> Layout:
        return self._layout

    @layout.setter
    def layout(self, layout: Layout) -> None:
        """Switch layouts between calls (benchmarks compare them on one loaded model)."""
        self._layout = Layout(layout)
        if isinstance(self.core.runner, LeanRunner):
            self.core.runner.layout = self._layout

    @property
    def forward(self) -> str:
        """Which forward runs, and in which layout: lean/sequence, lean/batch or generic/batch."""
        return f"lean/{self._layout.value}" if isinstance(self.core.runner, LeanRunner) else "generic/batch"

    @property
    def kv_capacity_tokens(self) -> int:
        return self.core.blocks.num_blocks * BLOCK_SIZE

    def encode_chat(self, messages: Sequence[dict[str, str]], after: int | None = None) -> list[int]:
        return chat_ids(self.core.model.tokenizer, messages, after)

    def encode(self, text: str) -> list[int]:
        return self.core.model.tokenizer.encode(text, add_special_tokens=False)

    def count_tokens(self, text: str) -> int:
        return len(self.encode(text))

    # --- the async API ---------------------------------------------------------------------

    async def sample(
        self, prefix: str | Sequence[int], branches: Sequence[BranchParams], tag: object = None
    ) -> list[Branch]:
        if not branches:
            raise ValueError("branches must not be empty")
        ids = self.encode(prefix) if isinstance(prefix, str) else list(prefix)
        if not ids:
            raise ValueError("prefix must not be empty")
        self._check_fits(len(ids), branches)
        return await self._submit(Job.sample(ids, list(branches), tag))

    async def continue_branches(
        self,
        handles: Sequence[Any],
        appended: str | Sequence[int],
        branches: Sequence[BranchParams],
        tag: object = None,
    ) -> list[Branch]:
        if len(handles) != len(branches):
            raise ValueError(f"got {len(handles)} handles for {len(branches)} branch params")
        ids = appended_ids(self.encode, appended)
        if not all(isinstance(h, Handle) for h in handles):
            raise ValueError("handles must come from this engine's sample()")
        if len({id(h.sequence) for h in handles}) != len(handles):
            raise ValueError("a branch may appear only once per continue_branches call")
        for h, p in zip(handles, branches, strict=True):
            self._check_fits(len(h.sequence.tokens) + len(ids), [p])
        return await self._submit(Job.continuation(list(handles), ids, list(branches), tag))

    def release(self, handles: Sequence[Any]) -> None:
        """The caller is done with these branches: their KV goes back to the pool at the next step."""
        for h in handles:
            if isinstance(h, Handle) and h.finalizer is not None and h.finalizer.detach() is not None:
                self._inbox.put(_Release(h.sequence))

    def _check_fits(self, used: int, branches: Sequence[BranchParams]) -> None:
        need = used + max(b.max_new_tokens for b in branches)
        if need > self.core.model.context_length:
            raise ContextLengthError(
                f"prompt of {used} tokens plus {need - used} new tokens exceeds the model's "
                f"context of {self.core.model.context_length} tokens"
            )
        blocks = self.core.blocks.blocks_for(need) + len(branches) - 1  # the fork's spares
        if blocks > self.core.blocks.num_blocks:
            raise RequestTooLargeError(
                f"{used} prompt tokens plus {need - used} new tokens for {len(branches)} branches need "
                f"{blocks * BLOCK_SIZE} KV slots; the pool holds {self.kv_capacity_tokens} (EGRM_KV_CACHE_MB)"
            )
        most = self.core.scheduler.max_batch_branches
        if len(branches) > most:
            raise RequestTooLargeError(
                f"{len(branches)} branches, more than run at once (EGRM_MAX_BATCH_BRANCHES={most})"
            )

    async def _submit(self, job: Job) -> list[Branch]:
        if self.queue_depth >= self._max_queue:
            raise EngineBusyError(f"engine queue is full ({self._max_queue} jobs waiting)")
        self._put_work(job)
        try:
            return await asyncio.wrap_future(job.future)
        except asyncio.CancelledError:
            self._inbox.put(_Abort(job))  # its sequences stop at the next step, their blocks freed
            raise

    def _put_work(self, work: Job | _Call) -> None:
        with self._submitting:
            self._submitted += 1
        self._inbox.put(work)

    @property
    def queue_depth(self) -> int:
        waiting = self._core.scheduler.queued_jobs if self._core is not None else 0
        return self._submitted - self._taken + waiting

    def stats(self) -> EngineStats:
        core = self.core
        core.stats.queue_depth = self.queue_depth
        core.stats.kv_bytes = core.blocks.used * core.block_bytes
        core.stats.kv_capacity_bytes = core.blocks.num_blocks * core.block_bytes
        core.stats.prefix_cache_hit_tokens = core.blocks.hit_tokens
        return core.stats

    async def ready(self) -> bool:
        return True

    async def close(self) -> None:
        await asyncio.to_thread(self._close)

    def _close(self) -> None:
        self._inbox.put(None)
        self._thread.join(timeout=60)

    # --- on the model thread ---------------------------------------------------------------

    def add(self, job: Job) -> None:
        """Hand a job to the core (on the model thread; tests call it, then step())."""
        self.core.add(job)

    def step(self) -> bool:
        """One core step, and the callers of the jobs it finished answered. False when there was
        nothing it could run."""
        finished = self.core.step()
        for job in finished or ():
            self._answer(job)
        return finished is not None

    def _answer(self, job: Job) -> None:
        """All its branches finished: answer the caller with handles that keep their KV until
        released (or, as a safety net, until the handles are collected)."""
        branches = [
            Branch(
                text=seq.text or "",
                token_ids=seq.new_tokens,
                finish_reason=seq.finish,
                prompt_tokens=seq.prompt_tokens,
                cached_prompt_tokens=seq.cached_tokens,
                logprobs=seq.logprobs,
                handle=self._handle(seq),
            )
            for seq in job.sequences
            if seq.finish is not None
        ]
        job.detach()
        if not job.future.done():
            job.future.set_result(branches)

    def _handle(self, seq: Seq) -> Handle:
        handle = Handle(seq)
        handle.finalizer = weakref.finalize(handle, self._inbox.put, _Release(seq, collected=True))
        return handle

    def _loop(self) -> None:
        closing = False
        while True:
            busy = self._core is not None and self._core.has_work
            if closing and not busy:
                return
            closing |= self._collect(block=not busy and not closing)
            if self._core is None or not self._core.has_work:
                continue
            self._last_jobs = max(self._last_jobs if busy else 1, len(self._core.scheduler.jobs))
            try:
                if not self.step():
                    time.sleep(0.005)  # everything waits for blocks held elsewhere: let the callers move
            except BaseException as exc:  # never lose the thread: fail what was in flight
                log.exception("engine step failed")
                self._fail_all(exc)

    def _collect(self, block: bool) -> bool:
        """Take what the inbox holds (waiting for it when idle); True when asked to close."""
        items: list[Job | _Abort | _Release | _Call | None] = []
        try:
            items.append(self._inbox.get(block=block))
        except queue.Empty:
            pass
        # Under concurrency, replies to the last batch come back as new requests a few ms apart:
        # an idle engine that served several at once waits up to the window for as many again.
        deadline = time.monotonic() + self._window_s if block and self._last_jobs > 1 else 0.0
        while True:
            wait = deadline - time.monotonic()
            try:
                more = wait > 0 and len(items) < self._last_jobs
                items.append(self._inbox.get(timeout=wait) if more else self._inbox.get_nowait())
            except queue.Empty:
                break
        closing = False
        for item in items:
            if item is None:
                closing = True
            elif isinstance(item, _Call):
                self._taken += 1
                try:
                    item.future.set_result(item.fn())
                except BaseException as exc:
                    item.future.set_exception(exc)
            elif isinstance(item, _Release):
                self.core.stats.gc_released += item.collected
                self.core.release(item.seq)
            elif isinstance(item, _Abort):
                self.core.abort(item.job)
                _cancel(item.job)
            else:
                self._taken += 1
                if item.future.set_running_or_notify_cancel():
                    self.add(item)
        return closing

    def _fail_all(self, exc: BaseException) -> None:
        for job in list(self.core.scheduler.jobs):
            self.core.abort(job)
            if not job.future.done():
                job.future.set_exception(exc)


def _cancel(job: Job) -> None:
    """Answer an aborted job's caller, who no longer waits: cancelled."""
    if not job.future.done() and not job.future.cancel():  # running: cancel() cannot
        job.future.set_exception(CancelledError("the caller stopped waiting"))
