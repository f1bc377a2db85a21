"""The embedded engine: an in-process torch model behind the async Engine contract.

One model thread runs `while there is work: step()`, and a step reads top-down: schedule (what
each sequence computes now) -> one forward for all of it -> one vectorised sample -> settle what
finished. Requests only put jobs in the inbox and await futures, so the event loop never blocks.

Why one thread for ALL torch work, loading included: torch's CPU kernels use OpenMP (libgomp),
and every OS thread that runs a parallel region gets its own team of worker threads. Once more
OpenMP threads exist than cores, libgomp stops spin-waiting between regions, and on two cores
the many small regions of a decode step then ran 1.6x slower (measured: 0.51 s vs 0.81 s for one
16-token sample). So the model is loaded, run and benchmarked on this thread.

Where things live: a branch in sequence.py, KV in kv_cache.py, the step's plan in scheduler.py,
the forward in model_runner.py (lean_llama.py, attention.py), sampling in decoder.py.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from app.engines.base import (
    Branch,
    BranchParams,
    ContextLengthError,
    EngineBusyError,
    EngineStats,
    RequestTooLargeError,
    appended_ids,
    client_request,
)
from app.engines.chat import chat_ids
from app.engines.embedded import lean_llama
from app.engines.embedded.constraint import build_trie
from app.engines.embedded.decoder import advance, draw
from app.engines.embedded.kv_cache import BLOCK_SIZE, BlockManager, KVPool
from app.engines.embedded.lean_llama import LeanLlama
from app.engines.embedded.loader import LoadedModel, load_model
from app.engines.embedded.model_runner import GenericRunner, Layout, LeanRunner
from app.engines.embedded.scheduler import Chunk, Scheduler
from app.engines.embedded.sequence import Handle, Job
from app.engines.embedded.sequence import Sequence as Seq

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Call:
    """Other work for the model thread (loading, benchmarks' reference runs)."""

    fn: Callable[[], Any]
    future: Future = field(default_factory=Future)


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
        self._stats = EngineStats()
        self._max_queue = max_queue
        self._window_s = batch_window_ms / 1000
        self._last_jobs = 1  # most jobs in flight at once during the last busy spell
        # Jobs, calls, sequences whose handles are gone (their KV is freed), and None to close.
        self._inbox: queue.Queue[Job | _Call | Seq | None] = queue.Queue()
        self._scheduler: Scheduler | None = None
        self._thread = threading.Thread(target=self._loop, name="egrm-engine", daemon=True)
        self._thread.start()
        try:
            self.run_on_model_thread(
                lambda: self._setup(model, lean, prefix_cache, max_batch_branches, max_batch_tokens, kv_cache_mb)
            )
        except BaseException:
            self._close()
            raise

    def _setup(
        self,
        model: LoadedModel | Callable[[], LoadedModel],
        lean: bool | None,
        prefix_cache: bool,
        max_seqs: int,
        max_tokens: int,
        kv_cache_mb: float,
    ) -> None:
        self._m = model if isinstance(model, LoadedModel) else model()
        if lean and not lean_llama.supports(self._m.model):
            raise ValueError(f"the lean forward supports llama-family models, not {self._m.model.config.model_type}")
        use_lean = lean if lean is not None else lean_llama.supports(self._m.model)
        cfg, dtype, device = self._m.model.config, self._m.model.dtype, self._m.device
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        per_token = KVPool.bytes_per_token(cfg.num_hidden_layers, kv_heads, head_dim, dtype)
        self._block_bytes = per_token * BLOCK_SIZE
        blocks = BlockManager(int(kv_cache_mb * 2**20) // self._block_bytes, BLOCK_SIZE, prefix_cache and use_lean)
        self._blocks = blocks
        self._runner: LeanRunner | GenericRunner
        if use_lean:
            pool = KVPool(cfg.num_hidden_layers, kv_heads, head_dim, blocks.num_blocks, BLOCK_SIZE, dtype, device)
            self._runner = LeanRunner(LeanLlama(self._m.model), pool, blocks, self._layout)
        else:
            self._runner = GenericRunner(self._m.model)
        self._scheduler = Scheduler(blocks, max_seqs, max_tokens)

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
        self._inbox.put(call)
        return call.future

    def run_on_model_thread(self, fn: Callable[[], Any]) -> Any:
        """Run fn where the model runs, and wait (blocking): for benchmarks and tools, not requests."""
        return self.call(fn).result()

    # --- what it is ------------------------------------------------------------------------

    @property
    def model_name(self) -> str:
        return self._m.name

    @property
    def dtype(self) -> str:
        """The weights' and compute dtype, e.g. "float32" ("auto" resolved at load)."""
        return str(self._m.model.dtype).removeprefix("torch.")

    @property
    def layout(self) -> Layout:
        return self._layout

    @layout.setter
    def layout(self, layout: Layout) -> None:
        """Switch layouts between calls (benchmarks compare them on one loaded model)."""
        self._layout = Layout(layout)
        if isinstance(self._runner, LeanRunner):
            self._runner.layout = self._layout

    @property
    def forward_kind(self) -> str:
        return f"lean/{self._layout.value}" if isinstance(self._runner, LeanRunner) else "generic/batch"

    @property
    def kv_capacity_tokens(self) -> int:
        return self._blocks.num_blocks * BLOCK_SIZE

    def encode_chat(self, messages: Sequence[dict[str, str]], after: int | None = None) -> list[int]:
        return chat_ids(self._m.tokenizer, messages, after)

    def encode(self, text: str) -> list[int]:
        return self._m.tokenizer.encode(text, add_special_tokens=False)

    def count_tokens(self, text: str) -> int:
        return len(self.encode(text))

    # --- the async API ---------------------------------------------------------------------

    async def sample(self, prefix: str | Sequence[int], branches: Sequence[BranchParams]) -> list[Branch]:
        if not branches:
            raise ValueError("branches must not be empty")
        ids = self.encode(prefix) if isinstance(prefix, str) else list(prefix)
        if not ids:
            raise ValueError("prefix must not be empty")
        self._check_fits(len(ids), branches)
        return await self._submit(Job.sample(ids, list(branches), client_request.get()))

    async def continue_branches(
        self, handles: Sequence[Any], appended: str | Sequence[int], branches: Sequence[BranchParams]
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
        return await self._submit(Job.continuation(list(handles), ids, list(branches), client_request.get()))

    def _check_fits(self, used: int, branches: Sequence[BranchParams]) -> None:
        need = used + max(b.max_new_tokens for b in branches)
        if need > self._m.context_length:
            raise ContextLengthError(
                f"prompt of {used} tokens plus {need - used} new tokens exceeds the model's "
                f"context of {self._m.context_length} tokens"
            )
        blocks = self._blocks.blocks_for(need) + len(branches) - 1  # the fork's spares
        if blocks > self._blocks.num_blocks:
            raise RequestTooLargeError(
                f"{used} prompt tokens plus {need - used} new tokens for {len(branches)} branches need "
                f"{blocks * BLOCK_SIZE} KV slots; the pool holds {self.kv_capacity_tokens} (EGRM_KV_CACHE_MB)"
            )
        assert self._scheduler is not None
        if len(branches) > self._scheduler.max_seqs:
            raise RequestTooLargeError(
                f"{len(branches)} branches, more than run at once (EGRM_MAX_BATCH_BRANCHES={self._scheduler.max_seqs})"
            )

    async def _submit(self, job: Job) -> list[Branch]:
        if self.queue_depth >= self._max_queue:
            raise EngineBusyError(f"engine queue is full ({self._max_queue} jobs waiting)")
        self._inbox.put(job)
        try:
            return await asyncio.wrap_future(job.future)
        except asyncio.CancelledError:
            job.abandoned.set()  # its sequences stop at the next step, their blocks freed
            raise

    @property
    def queue_depth(self) -> int:
        waiting = self._scheduler.queued_jobs if self._scheduler is not None else 0
        return self._inbox.qsize() + waiting

    def stats(self) -> EngineStats:
        self._stats.queue_depth = self.queue_depth
        self._stats.kv_bytes = self._blocks.used * self._block_bytes
        self._stats.kv_capacity_bytes = self._blocks.num_blocks * self._block_bytes
        self._stats.prefix_cache_hit_tokens = self._blocks.hit_tokens
        return self._stats

    async def ready(self) -> bool:
        return True

    async def close(self) -> None:
        await asyncio.to_thread(self._close)

    def _close(self) -> None:
        self._inbox.put(None)
        self._thread.join(timeout=60)

    # --- on the model thread ---------------------------------------------------------------

    def step(self) -> bool:
        """One engine step: schedule -> one forward for every scheduled sequence of every request ->
        one vectorised sample -> postprocess. False when there was nothing it could run."""
        assert self._scheduler is not None
        chunks = self._scheduler.schedule()
        if not chunks:
            return False
        logits = self._runner.run(chunks)  # (chunks that complete their sequence, V)
        self._postprocess(chunks, logits)
        return True

    def _postprocess(self, chunks: list[Chunk], logits: torch.Tensor) -> None:
        assert self._scheduler is not None
        self._stats.batches += 1
        self._stats.decode_steps += any(c.tokens == 1 == c.seq.uncomputed and c.seq.computed for c in chunks)
        complete = [c for c in chunks if c.completes]
        for c in chunks:
            c.seq.computed += c.tokens
            self._blocks.commit(c.seq)
        sampling: list[Seq] = []
        rows: list[int] = []
        for row, c in enumerate(complete):
            job = c.seq.job
            assert job is not None
            if not job.forked:  # the prompt is in: its branches start from the same logits
                followers = job.sequences[1:]
                self._runner.fork(c.seq, followers, self._scheduler.fork(job))
                sampling += job.sequences
                rows += [row] * len(job.sequences)
            else:
                sampling.append(c.seq)
                rows.append(row)
        if sampling:
            picked = logits.index_select(0, torch.tensor(rows, device=logits.device))
            tokens, logprobs = draw(picked, sampling, min(self._m.eos_ids))
            for seq, token, logprob in zip(sampling, tokens, logprobs, strict=True):
                advance(seq, token, logprob, self._m.tokenizer, self._m.eos_ids)
                if seq.finish is not None:
                    self._scheduler.finish(seq)
        for job in {id(s.job): s.job for s in sampling if s.job is not None and s.job.done}.values():
            self._settle(job)

    def _settle(self, job: Job) -> None:
        """All its branches finished: answer the caller, and keep their KV for as long as it holds them."""
        assert self._scheduler is not None
        self._scheduler.settle(job)
        handles = [self._handle(seq) for seq in job.sequences]
        branches = [
            Branch(
                text=seq.text or "",
                token_ids=seq.new_tokens,
                finish_reason=seq.finish,
                prompt_tokens=seq.prompt_tokens,
                cached_prompt_tokens=seq.cached_tokens,
                logprobs=seq.logprobs,
                handle=handle,
            )
            for seq, handle in zip(job.sequences, handles, strict=True)
            if seq.finish is not None
        ]
        job.detach()
        if not job.future.done():
            job.future.set_result(branches)

    def _handle(self, seq: Seq) -> Handle:
        handle = Handle(seq)
        weakref.finalize(handle, self._inbox.put, seq)
        return handle

    def _loop(self) -> None:
        closing = False
        while True:
            busy = self._scheduler is not None and self._scheduler.has_work
            if closing and not busy:
                return
            closing |= self._collect(block=not busy and not closing)
            if self._scheduler is None or not self._scheduler.has_work:
                continue
            self._last_jobs = max(self._last_jobs if busy else 1, len(self._scheduler.jobs))
            try:
                if not self.step():
                    time.sleep(0.005)  # everything waits for blocks held elsewhere: let the callers move
            except BaseException as exc:  # never lose the thread: fail what was in flight
                log.exception("engine step failed")
                self._fail_all(exc)

    def _collect(self, block: bool) -> bool:
        """Take what the inbox holds (waiting for it when idle); True when asked to close."""
        items: list[Job | _Call | Seq | None] = []
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
                try:
                    item.future.set_result(item.fn())
                except BaseException as exc:
                    item.future.set_exception(exc)
            elif isinstance(item, Seq):
                assert self._scheduler is not None
                self._scheduler.release(item)
            elif item.future.set_running_or_notify_cancel():
                self.add(item)
        return closing

    def add(self, job: Job) -> None:
        """Hand a job to the scheduler (on the model thread; tests call it, then step())."""
        assert self._scheduler is not None
        for seq in job.sequences:
            parent = seq.parent
            if parent is not None:  # a continuation takes its branch's KV before anything reuses the blocks
                copies = self._scheduler.inherit(seq)
                if copies is not None:
                    self._runner.fork(parent, [seq], copies)
        job.handles = []  # the branches may go now: their KV that the job needs is its own
        self._scheduler.add(job)
        for seq, params in zip(job.sequences, job.params, strict=True):
            seq.node = build_trie(self._m.tokenizer, params.allowed) if params.allowed is not None else None
        self._stats.batched_requests += 1
        self._stats.batched_branches += job.branches

    def _fail_all(self, exc: BaseException) -> None:
        assert self._scheduler is not None
        for job in list(self._scheduler.jobs):
            job.abandoned.set()
            if not job.future.done():
                job.future.set_exception(exc)
        self._scheduler.drop_abandoned()  # all of them, freeing their blocks
