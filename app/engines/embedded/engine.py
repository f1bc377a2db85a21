"""The embedded engine: an in-process torch model behind the async Engine contract.

All model work runs on the scheduler's one thread, so the event loop never blocks; requests
await futures. Concurrent requests are batched: their prefixes are prefilled in one forward and
their branches decode in the same steps (llama-family models, on the lean forward). Other
architectures run on the generic transformers forward, one request at a time.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from app.engines.base import Branch, BranchParams, ContextLengthError, EngineStats, appended_ids
from app.engines.chat import chat_ids
from app.engines.embedded import lean_llama
from app.engines.embedded.decoder import Feed, RowRun, decode_steps
from app.engines.embedded.fork import BranchRef, ForkState
from app.engines.embedded.lean_llama import LeanLlama
from app.engines.embedded.loader import LoadedModel, load_model
from app.engines.embedded.packed import Layout, PackedFork
from app.engines.embedded.prefix_cache import PrefixCache
from app.engines.embedded.rounds import Fork, Round, Steps, abandoned_rows, on_fork, split_runs
from app.engines.embedded.scheduler import ContinueJob, ModelJob, SampleJob, Scheduler

log = logging.getLogger(__name__)


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
        max_batch_tokens: int = 2048,
    ):
        """model: a loaded model, or a loader to call on the model thread (see scheduler.py).

        lean: None = the lean forward where the architecture allows it; False = always generic.
        prefix_cache: keep the KV of prompt heads that requests share (lean forward only).
        """
        self.layout = Layout(layout)
        self._stats = EngineStats()
        # Forks live as long as someone holds one of their branches (the long path continues them):
        # weakly referenced here, so /metrics can say how much KV is held, never keeping one alive.
        self._forks: weakref.WeakSet[Fork] = weakref.WeakSet()
        self._forks_lock = threading.Lock()  # the model thread adds, the event loop sums
        self._scheduler = Scheduler(
            self._start, self._advance, max_queue, max_batch_branches, batch_window_ms, max_batch_tokens
        )
        try:
            self._scheduler.call(lambda: self._setup(model, lean, prefix_cache)).result()
        except BaseException:
            self._scheduler.close()
            raise

    def _setup(self, model: LoadedModel | Callable[[], LoadedModel], lean: bool | None, prefix_cache: bool) -> None:
        self._m = model if isinstance(model, LoadedModel) else model()
        if lean and not lean_llama.supports(self._m.model):
            raise ValueError(f"the lean forward supports llama-family models, not {self._m.model.config.model_type}")
        use_lean = lean if lean is not None else lean_llama.supports(self._m.model)
        self._lean = LeanLlama(self._m.model) if use_lean else None
        self.prefix_cache = PrefixCache() if self._lean is not None and prefix_cache else None

    @classmethod
    def load(cls, path: str, dtype: str = "auto", threads: int = 0, **kwargs: Any) -> EmbeddedEngine:
        return cls(lambda: load_model(path, dtype=dtype, threads=threads), **kwargs)

    def run_on_model_thread(self, fn: Callable[[], Any]) -> Any:
        """Run fn where the model runs, and wait (blocking): for benchmarks and tools, not requests."""
        return self._scheduler.call(fn).result()

    @property
    def model_name(self) -> str:
        return self._m.name

    @property
    def dtype(self) -> str:
        """The weights' and compute dtype, e.g. "float32" ("auto" resolved at load)."""
        return str(self._m.model.dtype).removeprefix("torch.")

    @property
    def forward_kind(self) -> str:
        return f"lean/{self.layout.value}" if self._lean else "generic/batch"

    def encode_chat(self, messages: Sequence[dict[str, str]], after: int | None = None) -> list[int]:
        return chat_ids(self._m.tokenizer, messages, after)

    def encode(self, text: str) -> list[int]:
        return self._m.tokenizer.encode(text, add_special_tokens=False)

    def count_tokens(self, text: str) -> int:
        return len(self.encode(text))

    async def _submit(self, job: SampleJob | ContinueJob) -> list[Branch]:
        future = self._scheduler.submit(job)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            job.abandoned.set()  # a queued job is skipped; a running one stops at its next step
            raise

    async def sample(self, prefix: str | Sequence[int], branches: Sequence[BranchParams]) -> list[Branch]:
        if not branches:
            raise ValueError("branches must not be empty")
        ids = self.encode(prefix) if isinstance(prefix, str) else list(prefix)
        if not ids:
            raise ValueError("prefix must not be empty")
        self._check_context(len(ids), branches)
        return await self._submit(SampleJob(ids, list(branches)))

    async def continue_branches(
        self, handles: Sequence[Any], appended: str | Sequence[int], branches: Sequence[BranchParams]
    ) -> list[Branch]:
        if len(handles) != len(branches):
            raise ValueError(f"got {len(handles)} handles for {len(branches)} branch params")
        ids = appended_ids(self.encode, appended)
        refs = [h for h in handles if isinstance(h, BranchRef)]
        if len(refs) != len(handles):
            raise ValueError("handles must come from this engine's sample()")
        # Branches of different forks continue fork by fork, each fork in one job.
        by_fork: dict[int, list[int]] = {}
        for i, ref in enumerate(refs):
            by_fork.setdefault(id(ref.fork), []).append(i)
        jobs = []
        for idx in by_fork.values():
            rows = [refs[i].row for i in idx]
            if len(set(rows)) != len(rows):
                raise ValueError("a branch may appear only once per continue_branches call")
            jobs.append((idx, ContinueJob(refs[idx[0]].fork, rows, ids, [branches[i] for i in idx])))
        done = await asyncio.gather(*(self._submit(job) for _, job in jobs))
        results: dict[int, Branch] = {}
        for (idx, _), branches_done in zip(jobs, done, strict=True):
            results.update(zip(idx, branches_done, strict=True))
        return [results[i] for i in range(len(refs))]

    def _check_context(self, used: int, branches: Sequence[BranchParams]) -> None:
        need = used + max(b.max_new_tokens for b in branches)
        if need > self._m.context_length:
            raise ContextLengthError(
                f"prompt of {used} tokens plus {need - used} new tokens exceeds the model's "
                f"context of {self._m.context_length} tokens"
            )

    # --- on the model thread -------------------------------------------------------------

    def stats(self) -> EngineStats:
        self._stats.queue_depth = self._scheduler.depth
        with self._forks_lock:
            self._stats.kv_bytes = sum(f.allocated_bytes for f in self._forks)
        if self.prefix_cache is not None:
            self._stats.prefix_cache_hit_tokens = self.prefix_cache.hit_tokens
        return self._stats

    def _start(self, jobs: Sequence[ModelJob]) -> list[Round]:
        """Rounds that serve these jobs (all new requests in one, continuations fork by fork),
        each run up to its first forward: for new requests, that includes their prefill."""
        self._stats.batches += 1
        self._stats.batched_requests += len(jobs)
        self._stats.batched_branches += sum(j.branches for j in jobs)
        rounds: list[Round] = []
        samples = [j for j in jobs if isinstance(j, SampleJob)]
        if samples:
            rounds.append(Round(self._sample_round(samples), list(samples)))
        merged: dict[int, list[ContinueJob]] = {}
        for j in jobs:
            if isinstance(j, ContinueJob):
                merged.setdefault(id(j.fork), []).append(j)
        rounds += [Round(self._continue_round(group), list(group)) for group in merged.values()]
        return [r for r in rounds if r.resume(None)]

    def _advance(self, rounds: list[Round]) -> list[Round]:
        """One forward per fork for all the rounds waiting on it; returns the rounds still going."""
        by_fork: dict[int, list[Round]] = {}
        for r in rounds:
            by_fork.setdefault(id(r.fork), []).append(r)
        going = []
        for group in by_fork.values():
            fork = group[0].fork
            feed: Feed = [[] for _ in range(fork.rows)]
            for r in group:  # rounds on one fork own disjoint rows
                for row, ids in enumerate(r.feed):
                    if ids:
                        feed[row] = ids
            try:
                logits = fork.extend(feed)
            except Exception as exc:
                log.exception("forward failed")
                for r in group:
                    r.fail(exc)
                continue
            self._stats.decode_steps += 1
            going += [r for r in group if r.resume(logits)]
        return going

    def _new_forks(self, jobs: list[SampleJob]) -> list[tuple[Fork, list[SampleJob]]]:
        forks: list[tuple[Fork, list[SampleJob]]]
        if self._lean is None:
            forks = [(ForkState(self._m.model, j.ids, j.branches, self._pad_id), [j]) for j in jobs]
        else:
            reserve = min(64, max(p.max_new_tokens for j in jobs for p in j.params))
            groups = [(j.ids, j.branches) for j in jobs]
            forks = [(PackedFork(self._lean, groups, self.layout, self._pad_id, reserve, self.prefix_cache), jobs)]
        with self._forks_lock:
            self._forks.update(fork for fork, _ in forks)
        return forks

    def _sample_round(self, jobs: list[SampleJob]) -> Steps:
        for fork, group in self._new_forks(jobs):
            params = [p for j in group for p in j.params]
            runs = yield from on_fork(
                fork,
                decode_steps(
                    fork,
                    self._m.tokenizer,
                    self._m.eos_ids,
                    range(fork.rows),
                    params,
                    fork.last_logits,
                    abandoned_rows(group),
                ),
            )
            reused = fork.reused if isinstance(fork, PackedFork) else [0]
            for g, (job, mine) in enumerate(zip(group, split_runs(runs, group), strict=True)):
                # The prefix was computed once: the first branch paid for it (less any head served
                # by the prefix cache), the others reused its KV.
                p = len(job.ids)
                job.future.set_result([self._branch(fork, r, p, p if i else reused[g]) for i, r in enumerate(mine)])

    def _continue_round(self, jobs: list[ContinueJob]) -> Steps:
        fork = jobs[0].fork
        taken: set[int] = set()
        now: list[ContinueJob] = []
        later: list[ContinueJob] = []
        for job in jobs:  # one continuation per branch at a time; a second one waits its turn
            (later if taken & set(job.rows) else now).append(job)
            taken |= set(job.rows)
        feed: list[list[int]] = [[] for _ in range(fork.rows)]
        cached: dict[int, int] = {}
        ready = []
        for job in now:
            appended = job.ids
            try:
                self._check_context(
                    max(fork.lengths[r] + len(fork.pending[r]) + len(appended) for r in job.rows), job.params
                )
            except ContextLengthError as exc:
                job.future.set_exception(exc)
                continue
            for row in job.rows:
                cached[row] = fork.lengths[row]
                feed[row], fork.pending[row] = fork.pending[row] + appended, []
            ready.append(job)
        if ready:
            logits = yield fork, feed
            rows = [r for j in ready for r in j.rows]
            params = [p for j in ready for p in j.params]
            runs = yield from on_fork(
                fork,
                decode_steps(fork, self._m.tokenizer, self._m.eos_ids, rows, params, logits, abandoned_rows(ready)),
            )
            for job, mine in zip(ready, split_runs(runs, ready), strict=True):
                job.future.set_result(
                    [self._branch(fork, r, cached[r.row] + len(feed[r.row]), cached[r.row]) for r in mine]
                )
        if later:
            yield from self._continue_round(later)

    @property
    def _pad_id(self) -> int:
        pad = self._m.tokenizer.pad_token_id
        return pad if pad is not None else min(self._m.eos_ids)

    @staticmethod
    def _branch(fork: Fork, run: RowRun, prompt: int, cached: int) -> Branch:
        if run.finish is None or run.text is None:
            raise RuntimeError("decode() returned an unfinished branch")
        return Branch(
            text=run.text,
            token_ids=run.tokens,
            finish_reason=run.finish,
            prompt_tokens=prompt,
            cached_prompt_tokens=cached,
            logprobs=run.logprobs,
            handle=BranchRef(fork, run.row),
        )

    async def ready(self) -> bool:
        return True

    async def close(self) -> None:
        await asyncio.to_thread(self._scheduler.close)
