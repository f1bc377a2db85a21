"""One forward for a step's chunks: their tokens laid out flat, their attention rows, their logits.

Two runners: the lean forward over the shared KV pool (llama family), and transformers' own
forward for any other causal LM (each sequence keeping its own cache; correct, not fast).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence as Seq
from enum import Enum

import torch
from transformers import DynamicCache, PreTrainedModel

from egrm.engines.embedded.attention import FEW_QUERIES, DenseRow, PaddedRows, StepInputs
from egrm.engines.embedded.kv_cache import BlockManager, KVPool
from egrm.engines.embedded.lean_llama import LeanLlama
from egrm.engines.embedded.scheduler import Chunk
from egrm.engines.embedded.sequence import Sequence


class Layout(str, Enum):
    """How the branches of one prompt meet in attention. Their KV is the same blocks either way."""

    BATCH = "batch"  # one row per branch: each reads the shared prefix on its own
    SEQUENCE = "sequence"  # one row per prompt, branches under a mask: the prefix is read once


class _Row:
    """The keys one attention row reads (every block of its sequences, once, whole) and its queries."""

    def __init__(self, chunks: list[Chunk], blocks: BlockManager):
        self.chunks = chunks
        self.size = blocks.block_size
        self.blocks: list[int] = []  # the pool blocks its keys are read from
        self.first: list[int] = []  # the position of each block's first token in its sequence(s)
        seen: set[int] = set()
        for c in chunks:
            for j in range(blocks.blocks_for(c.seq.computed + c.tokens)):  # its KV after this step's writes
                block = c.seq.blocks[j]
                if block in seen:  # shared blocks are full and at the same place in every sequence
                    continue
                seen.add(block)
                self.blocks.append(block)
                self.first.append(j * self.size)

    @property
    def queries(self) -> int:
        return sum(c.tokens for c in self.chunks)

    @property
    def keys(self) -> int:
        return len(self.blocks) * self.size

    def mask(self) -> torch.Tensor:
        """(Q, U) bool: a query sees the keys of its own sequence's blocks, up to its position
        (so never a slot past its sequence's last token)."""
        positions = (torch.tensor(self.first)[:, None] + torch.arange(self.size)).flatten()
        q_pos = torch.tensor([p for c in self.chunks for p in range(c.seq.computed, c.seq.computed + c.tokens)])
        causal = positions[None, :] <= q_pos[:, None]
        if len(self.chunks) == 1:
            return causal
        widest = max(len(c.seq.blocks) for c in self.chunks)
        tables = torch.tensor([c.seq.blocks + [-1] * (widest - len(c.seq.blocks)) for c in self.chunks])
        member = (torch.tensor(self.blocks)[None, :, None] == tables[:, None, :]).any(-1)  # (chunks, B)
        which = torch.tensor([i for i, c in enumerate(self.chunks) for _ in range(c.tokens)])
        return member[which].repeat_interleave(self.size, dim=1) & causal


class LeanRunner:
    def __init__(self, lean: LeanLlama, pool: KVPool, blocks: BlockManager, layout: Layout):
        self.lean, self.pool, self.blocks, self.layout = lean, pool, blocks, layout

    def run(self, chunks: Seq[Chunk]) -> torch.Tensor:
        """Logits (N, V) after the last token of each chunk that completes its sequence, in order."""
        return self.lean.forward(self.inputs(chunks), self.pool)

    def fork(self, leader: Sequence, followers: list[Sequence], copies: list[tuple[int, int]]) -> None:
        self.pool.copy_blocks(copies)

    def inputs(self, chunks: Seq[Chunk]) -> StepInputs:
        rows = [_Row(group, self.blocks) for group in self._groups(chunks)]
        self.pool.readable(b for r in rows for b in r.blocks)
        # Rows of few queries are batched by their count and their key blocks, each rounded up to a
        # power of two: a decode row padded to a prompt tail's 20 queries would do 20 times its
        # work, and a short request's row padded to the keys of a long one's five reasoning
        # branches (768 keys against 96-160) did 5-8 times its work in the 16-client mix.
        buckets: dict[tuple[int, int], list[_Row]] = {}
        for r in rows:
            if r.queries <= FEW_QUERIES:
                shape = (1 << (r.queries - 1).bit_length(), 1 << (len(r.blocks) - 1).bit_length())
                buckets.setdefault(shape, []).append(r)
        few = [r for shape in sorted(buckets) for r in buckets[shape]]
        many = [r for r in rows if r.queries > FEW_QUERIES]
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        start: dict[int, int] = {}  # sequence id -> its first flat token
        for row in few + many:
            for c in row.chunks:
                seq, a = c.seq, c.seq.computed
                start[seq.id] = len(ids)
                ids += seq.tokens[a : a + c.tokens]
                positions += range(a, a + c.tokens)
                slots += (self.blocks.slot(seq, p) for p in range(a, a + c.tokens))
        device = self.lean.device
        attention: list[PaddedRows | DenseRow] = []
        at = 0
        for shape in sorted(buckets):
            attention.append(self._padded(buckets[shape], at))
            at += sum(r.queries for r in buckets[shape])
        for row in many:
            keys = torch.tensor(row.blocks, device=device)
            attention.append(DenseRow(at, at + row.queries, keys, row.size, row.mask()[None, None].to(device)))
            at += row.queries
        wanted = [start[c.seq.id] + c.tokens - 1 for c in chunks if c.completes]
        return StepInputs(
            torch.tensor(ids, device=device),
            torch.tensor(positions, device=device),
            torch.tensor(slots, device=device),
            attention,
            torch.tensor(wanted, dtype=torch.long, device=device),
        )

    def _groups(self, chunks: Seq[Chunk]) -> list[list[Chunk]]:
        if self.layout is Layout.BATCH:
            return [[c] for c in chunks]
        groups: dict[int, list[Chunk]] = {}
        for c in chunks:
            groups.setdefault(c.seq.group, []).append(c)
        return list(groups.values())

    def _padded(self, rows: list[_Row], flat: int) -> PaddedRows:
        """rows whose queries are flat tokens [flat, ...), in order."""
        S, Q, B = len(rows), max(r.queries for r in rows), max(len(r.blocks) for r in rows)
        size = rows[0].size
        mask = torch.zeros(S, Q, B * size, dtype=torch.bool)
        mask[:, :, 0] = True  # padding queries see one key, so no softmax is over nothing
        query_index = torch.full((S, Q), flat, dtype=torch.long)
        key_blocks = torch.empty(S, B, dtype=torch.long)
        out_index: list[int] = []
        for s, row in enumerate(rows):
            q, b = row.queries, len(row.blocks)
            mask[s, :q, : row.keys] = row.mask()
            query_index[s, :q] = torch.arange(flat, flat + q)
            key_blocks[s, :b] = torch.tensor(row.blocks)
            key_blocks[s, b:] = row.blocks[0]  # padding keys: a block the row reads, masked out
            out_index += range(s * Q, s * Q + q)
            flat += q
        device = self.lean.device
        return PaddedRows.build(
            query_index.flatten().to(device),
            key_blocks.flatten().to(device),
            mask.to(device),
            torch.tensor(out_index, device=device),
            size,
            self.lean.dtype,
            self.lean.heads // self.lean.kv_heads,
        )


class GenericRunner:
    """transformers' forward for models the lean one does not cover: each sequence keeps its own
    DynamicCache (seq.kv) and each chunk is its own forward. The block manager still accounts for
    their KV, so admission and limits are the same."""

    def __init__(self, model: PreTrainedModel):
        self.model = model
        self.device = next(model.parameters()).device

    @torch.inference_mode()
    def run(self, chunks: Seq[Chunk]) -> torch.Tensor:
        wanted = []
        for c in chunks:
            seq, a = c.seq, c.seq.computed
            if a == 0 or seq.kv is None:
                seq.kv = DynamicCache(config=self.model.config)
            ids = torch.tensor([seq.tokens[a : a + c.tokens]], device=self.device)
            positions = torch.arange(a, a + c.tokens, device=self.device)[None]
            out = self.model(input_ids=ids, position_ids=positions, cache=seq.kv, use_cache=True, logits_to_keep=1)
            if c.completes:
                wanted.append(out.logits[0, -1].float())
        return torch.stack(wanted) if wanted else torch.empty(0, device=self.device)

    def fork(self, leader: Sequence, followers: list[Sequence], copies: list[tuple[int, int]]) -> None:
        for seq in followers:
            seq.kv = copy.deepcopy(leader.kv)
