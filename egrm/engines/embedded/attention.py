"""Attention over the KV pool for one step's flat tokens, in the two shapes a step has.

A step's T new tokens come from many sequences, laid out flat. Attention is per row: the tokens
of one sequence (batch layout) or of all the branches of one prompt (sequence layout, each query
seeing the shared prefix and its own branch under a mask). A row reads the pool blocks it needs,
whole: one gather per block, not per slot (measured here, 20 blocks of 16 slots: 11 us against
43 us). A block's slots past its sequence's last token are masked out (and finite: KVPool zeroes
a block before it is first read).

- Rows with few queries (decodes, short continuations) go together, padded to a common width,
  into one SDPA call with an additive mask.
- A row with many queries (a prompt chunk) goes alone to SDPA's flash kernel, with a boolean mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from egrm.engines.embedded.kv_cache import by_block

# Up to this many queries per row, rows are padded together into one call (PaddedRows).
FEW_QUERIES = 32


def read_blocks(kv: torch.Tensor, blocks: torch.Tensor, block_size: int) -> torch.Tensor:
    """The K and V of whole pool blocks, in the order given: kv (2, KVH, slots, hd) ->
    (2, KVH, len(blocks) * block_size, hd)."""
    two, kv_heads, _, hd = kv.shape
    return by_block(kv, block_size).index_select(2, blocks).view(two, kv_heads, -1, hd)


@dataclass(slots=True)
class PaddedRows:
    """S rows of at most Q queries and B key blocks, padded; their real tokens are consecutive
    in the flat order."""

    query_index: torch.Tensor  # (S*Q,) flat token of each padded query (padding: any real one)
    key_blocks: torch.Tensor  # (S*B,) pool block of each row's keys (padding: a block the row reads)
    bias: torch.Tensor  # (S, 1, G*Q, B*block_size) model dtype: 0 where a query sees a key, -inf elsewhere
    out_index: torch.Tensor  # (Tg,) where each real query sits among the S*Q padded ones
    rows: int
    queries: int
    block_size: int

    @classmethod
    def build(
        cls, query_index, key_blocks, mask: torch.Tensor, out_index, block_size: int, dtype, groups: int
    ) -> PaddedRows:
        """mask (S, Q, B*block_size) bool; made into the bias once per step, not once per layer, for
        each of the `groups` query heads that share a KV head (see attend)."""
        S, Q, _ = mask.shape
        bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
        return cls(query_index, key_blocks, bias[:, None].repeat(1, 1, groups, 1), out_index, S, Q, block_size)

    def attend(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """q (T, H, hd) flat; kv (2, KVH, slots, hd) the pool's keys and values. Returns (Tg, H, hd).

        One SDPA call for all rows, the G query heads of a KV head folded into its queries
        ((S, H, Q) -> (S, KVH, G*Q)), so each KV head's keys are read once for all of them. Measured
        here against SDPA's enable_gqa (one layer, 2 cores): 16 rows of 8 queries over 320 keys
        0.58x in bf16, 0.95x in fp32; one row of 4 over 3,840 keys 0.60x / 0.76x; a single query
        over 3,840 keys 1.22x / 0.72x. Whole requests, interleaved in one process (bf16 / fp32):
        M=5 decoding 32 tokens after a 2,021-token prefix 0.94x / 0.97x, 16 such requests at once
        over 250-token prompts 0.93x / 0.98x."""
        S, Q = self.rows, self.queries
        _, H, hd = q.shape
        both = read_blocks(kv, self.key_blocks, self.block_size)  # (2, KVH, S*U, hd)
        kv_heads = both.shape[1]
        rq = q.index_select(0, self.query_index).view(S, Q, H, hd).transpose(1, 2)  # (S, H, Q, hd)
        rq = rq.reshape(S, kv_heads, H // kv_heads * Q, hd)  # heads h*G .. h*G+G-1 read KV head h
        k, v = both.view(2, kv_heads, S, -1, hd).transpose(1, 2)  # (S, KVH, U, hd) each
        out = F.scaled_dot_product_attention(rq, k, v, attn_mask=self.bias)  # (S, KVH, G*Q, hd)
        return out.reshape(S, H, Q, hd).transpose(1, 2).reshape(S * Q, H, hd).index_select(0, self.out_index)


@dataclass(slots=True)
class DenseRow:
    """One row of many queries: flat tokens [start, stop)."""

    start: int
    stop: int
    key_blocks: torch.Tensor  # (B,)
    block_size: int
    mask: torch.Tensor  # (1, 1, Q, B*block_size) bool

    def attend(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        rq = q[self.start : self.stop].transpose(0, 1)[None]  # (1, H, Q, hd)
        both = read_blocks(kv, self.key_blocks, self.block_size)  # (2, KVH, U, hd)
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
