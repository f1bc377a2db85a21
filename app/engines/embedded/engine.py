"""The embedded engine: an in-process torch model behind the async Engine contract.

All model work runs on one dedicated thread, so the event loop never blocks; requests await
futures. One call = one prefill of the shared prefix + one batched decode of its branches.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from app.engines.base import Branch, BranchParams, ContextLengthError
from app.engines.embedded.decoder import RowRun, decode
from app.engines.embedded.fork import BranchRef, ForkState
from app.engines.embedded.loader import LoadedModel, load_model


class EmbeddedEngine:
    def __init__(self, loaded: LoadedModel):
        self._m = loaded
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="egrm-engine")

    @classmethod
    def load(cls, path: str, dtype: str = "bfloat16", threads: int = 0) -> EmbeddedEngine:
        return cls(load_model(path, dtype=dtype, threads=threads))

    @property
    def model_name(self) -> str:
        return self._m.name

    @property
    def tokenizer(self) -> Any:
        return self._m.tokenizer

    def render_chat(self, messages: Sequence[dict[str, str]]) -> str:
        return str(self._m.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False))

    def encode(self, text: str) -> list[int]:
        return self._m.tokenizer.encode(text, add_special_tokens=False)

    def count_tokens(self, text: str) -> int:
        return len(self.encode(text))

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, partial(fn, *args))

    async def sample(self, prefix: str | Sequence[int], branches: Sequence[BranchParams]) -> list[Branch]:
        if not branches:
            raise ValueError("branches must not be empty")
        ids = self.encode(prefix) if isinstance(prefix, str) else list(prefix)
        if not ids:
            raise ValueError("prefix must not be empty")
        self._check_context(len(ids), branches)
        return await self._run(self._sample_sync, ids, list(branches))

    async def continue_branches(
        self, handles: Sequence[Any], text: str, branches: Sequence[BranchParams]
    ) -> list[Branch]:
        if len(handles) != len(branches):
            raise ValueError(f"got {len(handles)} handles for {len(branches)} branch params")
        if not text:
            raise ValueError("text to append must not be empty")
        refs = [h for h in handles if isinstance(h, BranchRef)]
        if len(refs) != len(handles):
            raise ValueError("handles must come from this engine's sample()")
        # Branches of different forks continue fork by fork, each fork in one batch.
        results: dict[int, Branch] = {}
        forks: dict[int, list[int]] = {}
        for i, ref in enumerate(refs):
            forks.setdefault(id(ref.fork), []).append(i)
        for idx in forks.values():
            rows = [refs[i].row for i in idx]
            if len(set(rows)) != len(rows):
                raise ValueError("a branch may appear only once per continue_branches call")
            done = await self._run(self._continue_sync, refs[idx[0]].fork, rows, text, [branches[i] for i in idx])
            results.update(zip(idx, done, strict=True))
        return [results[i] for i in range(len(refs))]

    def _check_context(self, used: int, branches: Sequence[BranchParams]) -> None:
        need = used + max(b.max_new_tokens for b in branches)
        if need > self._m.context_length:
            raise ContextLengthError(
                f"prompt of {used} tokens plus {need - used} new tokens exceeds the model's "
                f"context of {self._m.context_length} tokens"
            )

    def _sample_sync(self, ids: list[int], branches: list[BranchParams]) -> list[Branch]:
        fork = ForkState(self._m.model, ids, len(branches), self._pad_id)
        runs = decode(fork, self._m.tokenizer, self._m.eos_ids, range(len(branches)), branches, fork.last_logits)
        # The prefix was computed once: the first branch paid for it, the others reused its KV.
        return [self._branch(fork, r, prompt=len(ids), cached=len(ids) if r.row else 0) for r in runs]

    def _continue_sync(self, fork: ForkState, rows: list[int], text: str, branches: list[BranchParams]) -> list[Branch]:
        appended = self.encode(text)
        cached = {row: fork.lengths[row] for row in rows}
        feed: list[list[int]] = [[] for _ in range(fork.rows)]
        for row in rows:
            feed[row], fork.pending[row] = fork.pending[row] + appended, []
        self._check_context(max(cached[r] + len(feed[r]) for r in rows), branches)
        logits = fork.extend(feed)
        runs = decode(fork, self._m.tokenizer, self._m.eos_ids, rows, branches, logits)
        return [self._branch(fork, r, prompt=cached[r.row] + len(feed[r.row]), cached=cached[r.row]) for r in runs]

    @property
    def _pad_id(self) -> int:
        pad = self._m.tokenizer.pad_token_id
        return pad if pad is not None else min(self._m.eos_ids)

    @staticmethod
    def _branch(fork: ForkState, run: RowRun, prompt: int, cached: int) -> Branch:
        assert run.finish is not None and run.text is not None  # decode() finishes every run
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
        self._executor.shutdown(wait=True, cancel_futures=True)
