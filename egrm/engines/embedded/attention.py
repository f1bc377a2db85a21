"""Attention over the KV pool for one step's flat tokens, in the two shapes a step has.

A step's T new tokens come from many sequences, laid out flat. Attention is per row: the tokens
of one sequence (batch layout) or of all the branches of one prompt (sequence layout, each query
seeing the shared prefix and its own branch under a mask). A row reads the pool slots it needs,
gathered: written slots only, so an unwritten slot is never read.

- Rows with few queries (decodes, short continuations) go together, padded to a common width,
  into two batched matmuls with the mask as an additive bias: for a few queries per row SDPA's
  fixed cost is larger than the matmuls (measured: at 5 rows, more than all matmuls of the step).
- A row with many queries (a prompt chunk) goes alone to SDPA's flash kernel, with a boolean mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# Up to this many queries per row, attention runs as plain matmuls (PaddedRows).
FEW_QUERIES = 32


@dataclass(slots=True)
class PaddedRows:
    """S rows of at most Q queries, padded; their real tokens are consecutive in the flat order."""

    query_index: torch.Tensor  # (S*Q,) flat token of each padded query (padding: any real one)
    key_slots: torch.Tensor  # (S*U,) pool slot of each padded key (padding: a written slot)
    bias: torch.Tensor  # (KVH*S, G*Q, U) float32: 0 where a query sees a key, -inf elsewhere
    out_index: torch.Tensor  # (Tg,) where each real query sits among the S*Q padded ones
    rows: int
    queries: int

    @classmethod
    def build(cls, query_index, key_slots, mask: torch.Tensor, out_index, kv_heads: int, groups: int) -> PaddedRows:
        """mask (S, Q, U) bool; made into the bias once per step, not once per layer."""
        S, Q, U = mask.shape
        bias = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill_(~mask, float("-inf"))
        bias = bias[None, :, None].expand(kv_heads, S, groups, Q, U).reshape(kv_heads * S, groups * Q, U)
        return cls(query_index, key_slots, bias, out_index, S, Q)

    def attend(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """q (T, H, hd) flat; kv (2, KVH, slots, hd) the pool's keys and values. Returns (Tg, H, hd).

        The G query heads of a KV group fold into the query axis, so the keys are never repeated;
        scores in fp32 (on CPU a bf16 matmul against the transposed keys is also slower)."""
        S, Q = self.rows, self.queries
        _, H, hd = q.shape
        KVH = kv.shape[1]
        grouped = (
            q.index_select(0, self.query_index)
            .view(S, Q, KVH, H // KVH, hd)
            .permute(2, 0, 3, 1, 4)
            .reshape(KVH * S, (H // KVH) * Q, hd)
        )
        both = kv.index_select(2, self.key_slots)  # (2, KVH, S*U, hd)
        k, v = both[0].view(KVH * S, -1, hd), both[1].view(KVH * S, -1, hd)  # (KVH*S, U, hd)
        scores = torch.baddbmm(self.bias, grouped.float(), k.float().transpose(1, 2), alpha=hd**-0.5)
        out = torch.bmm(scores.softmax(dim=-1).to(v.dtype), v)  # (KVH*S, G*Q, hd)
        out = out.view(KVH, S, H // KVH, Q, hd).permute(1, 3, 0, 2, 4).reshape(S * Q, H, hd)
        return out.index_select(0, self.out_index)


@dataclass(slots=True)
class DenseRow:
    """One row of many queries: flat tokens [start, stop)."""

    start: int
    stop: int
    key_slots: torch.Tensor  # (U,)
    mask: torch.Tensor  # (1, 1, Q, U) bool

    def attend(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        rq = q[self.start : self.stop].transpose(0, 1)[None]  # (1, H, Q, hd)
        both = kv.index_select(2, self.key_slots)  # (2, KVH, U, hd)
        k, v = both[0][None], both[1][None]
        out = F.scaled_dot_product_attention(rq, k, v, attn_mask=self.mask, enable_gqa=True)
        return out[0].transpose(0, 1)  # (Q, H, hd)


@dataclass(slots=True)
class StepInputs:
    """Everything the forward needs for one step, on the model's device."""

    ids: torch.Tensor  # (T,) the new tokens, flat
    positions: torch.Tensor  # (T,) their RoPE positions
    slots: torch.Tensor  # (T,) the pool slots their K/V go to
    attention: list[PaddedRows | DenseRow]  # in flat order, covering [0, T)
    logit_index: torch.Tensor  # (N,) the flat tokens whose next-token logits are wanted
