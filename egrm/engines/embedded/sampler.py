"""Vectorised per-row sampling: temperatures, top-p and uniforms are [M] tensors."""

from __future__ import annotations

import torch

# The nucleus is searched inside the top-K tokens first; sorting the whole 49k vocabulary per
# step costs as much as a model step on CPU. When the top-K mass of some row does not reach its
# top_p, that call falls back to the full sort, so the result is exact either way.
_TOP_K = 256


def _nucleus_pick(scaled: torch.Tensor, top_ps: torch.Tensor, uniforms: torch.Tensor, k: int) -> torch.Tensor:
    """Inverse-CDF sampling in the top-p nucleus of each row; returns [M] token ids."""
    log_norm = torch.logsumexp(scaled, dim=-1, keepdim=True)  # [M, 1]
    top_vals, top_ids = scaled.topk(min(k, scaled.shape[-1]), dim=-1)  # [M, K], sorted
    probs = (top_vals - log_norm).exp()  # exact probabilities of the K best tokens
    cum = probs.cumsum(-1)
    if k < scaled.shape[-1] and bool((cum[:, -1] < top_ps).any()):
        return _nucleus_pick(scaled, top_ps, uniforms, scaled.shape[-1])
    # Keep a token while the mass before it is below top_p (the best token is always kept).
    probs = probs * ((cum - probs) < top_ps[:, None])
    kept = probs.cumsum(-1)
    target = (uniforms * kept[:, -1]).unsqueeze(-1)
    pick = torch.searchsorted(kept, target, right=True).clamp_max(kept.shape[-1] - 1)
    return top_ids.gather(-1, pick).squeeze(-1)


def sample(
    logits: torch.Tensor, temperatures: torch.Tensor, top_ps: torch.Tensor, uniforms: torch.Tensor
) -> torch.Tensor:
    """Draw one token per row of logits [M, V] (float32); temperature 0 rows are greedy."""
    greedy = logits.argmax(dim=-1)
    hot = temperatures > 0
    if not bool(hot.any()):
        return greedy
    scaled = logits / temperatures.clamp_min(1e-5)[:, None]
    drawn = _nucleus_pick(scaled, top_ps, uniforms, _TOP_K)
    return torch.where(hot, drawn, greedy)
