"""A lean forward for the llama family over a slot-addressed KV cache.

Why not the Hugging Face forward: on a CPU its per-step Python and dtype shuffling cost as much
as the matmuls at batch 5, and its cache grows by concatenation. This forward loads the same
weights (fused QKV and gate/up projections), writes each new K/V into a preallocated slot,
lets the caller say which cached slots each query may see (a boolean mask: that is how
branches share one prefix, in one sequence or in a batch), and computes logits only where
asked. Numerics follow transformers' llama (RMSNorm statistics and RoPE tables in fp32, SDPA
with grouped-query attention), so fp32 outputs match it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from app.engines.embedded.prepacked import Linear


def supports(model: PreTrainedModel) -> bool:
    """Plain llama-style models (llama, SmolLM, ...): no biases, default RoPE, tied or untied head."""
    cfg = model.config
    rope = getattr(cfg, "rope_parameters", None) or {}
    return (
        cfg.model_type == "llama"
        and not getattr(cfg, "attention_bias", False)
        and not getattr(cfg, "mlp_bias", False)
        and rope.get("rope_type", "default") == "default"
        and getattr(cfg, "hidden_act", "silu") == "silu"
    )


@dataclass(slots=True)
class LayerWeights:
    attn_norm: torch.Tensor  # (D,)
    qkv: Linear  # (H*hd + 2*KVH*hd, D)
    o: Linear  # (D, H*hd)
    mlp_norm: torch.Tensor  # (D,)
    gate_up: Linear  # (2*I, D)
    down: Linear  # (D, I)


def _layer_weights(layer: Any, prepack: bool) -> LayerWeights:
    """One decoder layer's weights, the projections that read the same input fused into one."""
    attn, mlp = layer.self_attn, layer.mlp
    return LayerWeights(
        attn_norm=layer.input_layernorm.weight,
        qkv=Linear(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]), prepack),
        o=Linear(attn.o_proj.weight, prepack),
        mlp_norm=layer.post_attention_layernorm.weight,
        gate_up=Linear(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), prepack),
        down=Linear(mlp.down_proj.weight, prepack),
    )


class KVCache:
    """Per-layer K and V tensors (S, KVH, C, hd), written at slots; separate tensors per layer
    so a write touches only its own slots."""

    def __init__(self, layers: int, rows: int, kv_heads: int, capacity: int, head_dim: int, dtype, device):
        shape = (rows, kv_heads, capacity, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]

    @property
    def rows(self) -> int:
        return self.keys[0].shape[0]

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def grow(self, capacity: int) -> None:
        """Make room for more slots (one copy); callers grow geometrically."""
        extra = capacity - self.capacity
        if extra <= 0:
            return
        for store in (self.keys, self.values):
            for i, t in enumerate(store):
                pad = t.new_zeros(t.shape[0], t.shape[1], extra, t.shape[3])
                store[i] = torch.cat([t, pad], dim=2)

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep (or repeat) rows by index: how batch mode copies one prefill to M rows."""
        for store in (self.keys, self.values):
            for i, t in enumerate(store):
                store[i] = t.index_select(0, index)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


# Up to this many queries per row, attention runs as plain matmuls (see LeanLlama._attend).
_FLASH_MIN_QUERIES = 32


class LeanLlama:
    def __init__(self, model: PreTrainedModel, prepack: bool = True):
        """prepack: lay the projection weights out once for oneDNN (CPU); see prepacked.py."""
        cfg = model.config
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        inner = model.model
        self.embed = inner.embed_tokens.weight  # (V, D)
        self.lm_head = Linear(model.lm_head.weight, prepack)  # (V, D); shares the embedding when tied
        self.final_norm = inner.norm.weight
        with torch.no_grad():
            self.layers = [_layer_weights(layer, prepack) for layer in inner.layers]
        rope = getattr(cfg, "rope_parameters", None) or {}
        base = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        self.inv_freq = 1.0 / (base ** (torch.arange(0, self.head_dim, 2, dtype=torch.float) / self.head_dim))

    def new_cache(self, rows: int, capacity: int) -> KVCache:
        return KVCache(len(self.layers), rows, self.kv_heads, capacity, self.head_dim, self.dtype, self.device)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # torch's fused kernel: equal to transformers' LlamaRMSNorm in fp32; in bf16 it rounds once
        # (after the scale) where transformers rounds twice, and costs 25% less.
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin tables (S, 1, Q, hd): the sin of the first half negated, for _rotate."""
        freqs = positions[..., None].float() * self.inv_freq  # (S, Q, hd/2)
        sin = freqs.sin()
        cos = torch.cat((freqs, freqs), dim=-1).cos()
        signed_sin = torch.cat((-sin, sin), dim=-1)
        return cos.to(self.dtype)[:, None], signed_sin.to(self.dtype)[:, None]

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
        # transformers' x*cos + rotate_half(x)*sin, where rotate_half(x) = cat(-x2, x1): the sign
        # rides in the table, so the rotation is a roll (bit-identical, two ops fewer per layer).
        return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin

    @staticmethod
    def decode_bias(mask: torch.Tensor, kv_heads: int, groups: int) -> torch.Tensor | None:
        """Few queries per row: the mask (S, 1, Q, U) as an additive bias (S*KVH, G*Q, U) for
        _attend's batched matmuls, made once per forward rather than once per layer. None when
        the queries are many (prefill: SDPA takes the boolean mask)."""
        S, _, Q, U = mask.shape
        if Q > _FLASH_MIN_QUERIES:
            return None
        bias = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill_(~mask, float("-inf"))
        return bias[:, :, None].expand(S, kv_heads, groups, Q, U).reshape(S * kv_heads, groups * Q, U)

    @staticmethod
    def _attend(
        q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """Masked grouped-query attention: q (S, H, Q, hd) over keys/values (S, KVH, U, hd).

        Prefill (many queries) goes to SDPA's flash kernel. A decode step has a few queries per
        row, and there that kernel's fixed cost dominates: measured here, 5 batched rows spent
        more time in it than in all the matmuls of the step. So few queries take two batched
        matmuls instead, the G query heads of a KV group folded into the query axis (no copy of
        the keys), the scale and the mask (`bias`, see decode_bias) applied by the first one.
        """
        S, H, Q, hd = q.shape
        if bias is None:
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        KVH, U = keys.shape[1], keys.shape[2]
        grouped = q.reshape(S * KVH, (H // KVH) * Q, hd)  # heads of a group are adjacent
        # Scores in fp32: more exact, and on CPU a bf16 matmul against the transposed slice of
        # the cache is slower than converting it (measured 116 vs 67 us at 5 rows x 270 slots).
        keys_t = keys.reshape(S * KVH, U, hd).float().transpose(1, 2)  # (S*KVH, hd, U)
        scores = torch.baddbmm(bias, grouped.float(), keys_t, alpha=hd**-0.5)  # (S*KVH, G*Q, U)
        probs = scores.softmax(dim=-1).to(values.dtype)
        return torch.bmm(probs, values.reshape(S * KVH, U, hd)).view(S, H, Q, hd)

    @torch.inference_mode()
    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        mask: torch.Tensor,
        cache: KVCache,
        logit_index: torch.Tensor,
        cache_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One step for S rows of Q new tokens each.

        ids, positions, slots: (S, Q) -- token, RoPE position, cache slot to write;
        mask: (S, 1, Q, U) bool -- which of the first U slots each query sees (its own included);
        logit_index: (N,) flat indices into S*Q of the tokens that need next-token logits;
        cache_rows: (S,) which cache rows these are, when only some rows take part (default: all).
        Returns (N, V) float32 logits.
        """
        S, Q = ids.shape
        H, KVH, hd = self.heads, self.kv_heads, self.head_dim
        used = mask.shape[-1]
        rows = (cache_rows if cache_rows is not None else torch.arange(S, device=ids.device))[:, None].expand(S, Q)
        cos, signed_sin = self._rope(positions)
        bias = self.decode_bias(mask, KVH, H // KVH)
        h = F.embedding(ids, self.embed)  # (S, Q, D)
        for i, w in enumerate(self.layers):
            qkv = w.qkv(self._norm(h, w.attn_norm)).view(S, Q, H + 2 * KVH, hd).transpose(1, 2)
            qk = self._rotate(qkv[:, : H + KVH], cos, signed_sin)  # queries and keys in one pass
            q, k, v = qk[:, :H], qk[:, H:], qkv[:, H + KVH :]  # (S, H, Q, hd), (S, KVH, Q, hd) x2
            # (S, Q) advanced indices around a slice: the assigned value is laid out (S, Q, KVH, hd).
            cache.keys[i][rows, :, slots] = k.transpose(1, 2)
            cache.values[i][rows, :, slots] = v.transpose(1, 2)
            keys, values = cache.keys[i][:, :, :used], cache.values[i][:, :, :used]
            if cache_rows is not None:  # a copy of the used slots of the rows taking part
                keys, values = keys.index_select(0, cache_rows), values.index_select(0, cache_rows)
            attn = self._attend(q, keys, values, mask, bias)  # (S, H, Q, hd)
            h = h + w.o(attn.transpose(1, 2).reshape(S, Q, H * hd))
            gate, up = w.gate_up(self._norm(h, w.mlp_norm)).chunk(2, dim=-1)
            h = h + w.down(F.silu(gate) * up)
        last = self._norm(h.reshape(S * Q, -1).index_select(0, logit_index), self.final_norm)
        return self.lm_head(last).float()
