"""A prefix prefilled once and forked into M rows of KV cache that decode as one batch.

Rows advance at their own pace: a row that has finished (or is not being continued) is fed a
dummy token whose key is masked out, so every row's cache holds exactly its own tokens as far
as attention is concerned. The handles given out with branches point back here, which is how
the long path continues a branch from its own cache without prefilling the prefix again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel


@dataclass(slots=True)
class BranchRef:
    """The handle of one branch: its fork (a ForkState or a PackedFork) and row."""

    fork: Any
    row: int


class ForkState:
    def __init__(self, model: PreTrainedModel, prefix_ids: Sequence[int], rows: int, pad_id: int):
        self.model = model
        self.pad_id = pad_id
        self.prefix_len = len(prefix_ids)
        self.cache = DynamicCache(config=model.config)
        device = next(model.parameters()).device
        ids = torch.tensor([list(prefix_ids)], dtype=torch.long, device=device)  # (1, P)
        with torch.inference_mode():
            out = model(input_ids=ids, cache=self.cache, use_cache=True, logits_to_keep=1)
        # One prefill for all rows: (1, kv_heads, P, hd) -> (M, kv_heads, P, hd).
        self.cache.batch_repeat_interleave(rows)
        self.rows = rows
        self.mask = torch.ones(rows, self.prefix_len, dtype=torch.long, device=device)  # (M, L)
        self.lengths = [self.prefix_len] * rows  # tokens each row actually attends to
        self.pending: list[list[int]] = [[] for _ in range(rows)]  # sampled, not yet in the cache
        self.last_logits = out.logits[:, -1].float().expand(rows, -1)  # (M, V)

    def extend(self, new_ids: Sequence[Sequence[int]]) -> torch.Tensor:
        """Feed each row its own tokens (possibly none); return the next-token logits (M, V).

        Rows are left-padded with masked dummies to a common width so the last column of every
        row that got tokens is a real token. Rows that got none keep their old logits.
        """
        width = max(len(ids) for ids in new_ids)
        device = self.mask.device
        ids = torch.full((self.rows, width), self.pad_id, dtype=torch.long, device=device)
        valid = torch.zeros(self.rows, width, dtype=torch.long, device=device)
        positions = torch.zeros(self.rows, width, dtype=torch.long, device=device)
        for row, row_ids in enumerate(new_ids):
            n = len(row_ids)
            if n:
                ids[row, width - n :] = torch.tensor(row_ids, dtype=torch.long)
                valid[row, width - n :] = 1
                positions[row, width - n :] = torch.arange(self.lengths[row], self.lengths[row] + n)
                self.lengths[row] += n
        self.mask = torch.cat([self.mask, valid], dim=1)
        with torch.inference_mode():
            out = self.model(
                input_ids=ids,
                attention_mask=self.mask,
                position_ids=positions,
                cache=self.cache,
                use_cache=True,
                logits_to_keep=1,
            )
        fed = valid[:, -1].bool()[:, None]
        self.last_logits = torch.where(fed, out.logits[:, -1].float(), self.last_logits)
        return self.last_logits

    @property
    def allocated_bytes(self) -> int:
        return self.kv_bytes

    @property
    def kv_bytes(self) -> int:
        """Bytes held by this fork's K and V tensors, all layers and rows."""
        total = 0
        for layer in self.cache.layers:
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
        return total
