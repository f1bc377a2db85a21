"""The engine's core, synchronous and single-threaded: add, abort, release, step.

A step reads top-down (nano-vllm's LLMEngine.step, vLLM's EngineCore.step): plan (the scheduler:
what each sequence computes) -> one forward for all of it (the runner) -> one vectorised draw
(decoder.py) -> update (the scheduler again: every sequence from the step's output). It knows
nothing of threads, futures or asyncio: engine.py runs it on the model thread behind the async
Engine contract, and tests drive it directly.

Where things live: a branch in sequence.py, KV in kv_cache.py, the plan and every change to a
sequence in scheduler.py, the forward in model_runner.py (lean_llama.py, attention.py), token
sampling in decoder.py and sampler.py.
"""

from __future__ import annotations

import torch

from egrm.engines.base import EngineStats
from egrm.engines.embedded import lean_llama
from egrm.engines.embedded.constraint import build_trie
from egrm.engines.embedded.decoder import decode_text, draw
from egrm.engines.embedded.kv_cache import BLOCK_SIZE, BlockManager, KVPool
from egrm.engines.embedded.lean_llama import LeanLlama
from egrm.engines.embedded.loader import LoadedModel
from egrm.engines.embedded.model_runner import GenericRunner, Layout, LeanRunner
from egrm.engines.embedded.scheduler import Scheduler
from egrm.engines.embedded.sequence import Job, Sequence


class EngineCore:
    def __init__(
        self,
        model: LoadedModel,
        layout: Layout,
        lean: bool | None,
        prefix_cache: bool,
        max_batch_branches: int,
        max_batch_tokens: int,
        kv_cache_mb: float,
    ):
        """lean: None = the lean forward where the architecture allows it; False = always generic.
        prefix_cache: reuse the KV of prompt heads that requests share (lean forward only)."""
        if lean and not lean_llama.supports(model.model):
            raise ValueError(f"the lean forward supports llama-family models, not {model.model.config.model_type}")
        self.model = model
        use_lean = lean if lean is not None else lean_llama.supports(model.model)
        cfg, dtype, device = model.model.config, model.model.dtype, model.device
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.block_bytes = KVPool.bytes_per_token(cfg.num_hidden_layers, kv_heads, head_dim, dtype) * BLOCK_SIZE
        self.blocks = BlockManager(int(kv_cache_mb * 2**20) // self.block_bytes, BLOCK_SIZE, prefix_cache and use_lean)
        self.runner: LeanRunner | GenericRunner
        if use_lean:
            pool = KVPool(cfg.num_hidden_layers, kv_heads, head_dim, self.blocks.num_blocks, BLOCK_SIZE, dtype, device)
            self.runner = LeanRunner(LeanLlama(model.model), pool, self.blocks, layout)
        else:
            self.runner = GenericRunner(model.model)
        self.scheduler = Scheduler(
            self.blocks,
            max_batch_branches,
            max_batch_tokens,
            model.eos_ids,
            lambda ids: decode_text(model.tokenizer, ids),
        )
        self.stats = EngineStats()
        self._eos_id = min(model.eos_ids)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def add(self, job: Job) -> None:
        """Take a job. A continuation's sequences take their branches' KV now, before anything
        reuses those blocks."""
        for seq in job.sequences:
            parent = seq.parent
            if parent is not None:
                copies = self.scheduler.inherit(seq)
                if copies is not None:
                    self.runner.fork(parent, [seq], copies)
        job.handles = []  # the branches may go now: what the job needs of their KV is its own
        self.scheduler.add(job)
        for seq, params in zip(job.sequences, job.params, strict=True):
            seq.node = build_trie(self.model.tokenizer, params.allowed) if params.allowed is not None else None
        self.stats.batched_requests += 1
        self.stats.batched_branches += job.branches

    def abort(self, job: Job) -> None:
        """Its caller stopped waiting: its sequences stop, their blocks are freed."""
        self.scheduler.abort(job)

    def release(self, seq: Sequence) -> None:
        """Nobody will continue this branch: its KV goes back to the pool."""
        self.scheduler.release(seq)

    @torch.inference_mode()
    def step(self) -> list[Job] | None:
        """One step: plan -> forward -> draw -> update. Returns the jobs it finished; None when
        there was nothing it could run (everything waits for blocks held elsewhere)."""
        plan = self.scheduler.plan()
        if plan is None:
            return None
        logits = self.runner.run(plan.chunks)  # (chunks that complete their sequence, V)
        picked = logits.index_select(0, torch.tensor(plan.rows, dtype=torch.long, device=logits.device))
        tokens, logprobs = draw(picked, plan.drawing, self._eos_id) if plan.drawing else ([], [])
        out = self.scheduler.update(plan, tokens, logprobs)
        for leader, followers, copies in out.forks:
            self.runner.fork(leader, followers, copies)
        self.stats.batches += 1
        self.stats.decode_steps += out.decoded
        background = plan.background_tokens
        self.stats.background_steps += background > 0
        self.stats.background_tokens += background
        self.stats.spare_tokens += plan.spare_tokens
        return out.finished
