"""What a step does with its logits: draw one token per drawing sequence (what then happens to the
sequence is the scheduler's update)."""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch
from transformers import PreTrainedTokenizerBase

from egrm.engines.embedded.constraint import TrieNode
from egrm.engines.embedded.sampler import log_normaliser, sample
from egrm.engines.embedded.sequence import Sequence


def decode_text(tokenizer: PreTrainedTokenizerBase, tokens: Seq[int]) -> str:
    return str(tokenizer.decode(list(tokens), skip_special_tokens=True))


def _allowed(node: TrieNode, eos_id: int) -> list[int]:
    return list(node.children) + ([eos_id] if node.terminal else [])


def _draw(
    logits: torch.Tensor,
    runs: Seq[Sequence],
    allowed_of: dict[int, list[int]],
    temperatures: torch.Tensor,
    top_ps: torch.Tensor,
    uniforms: torch.Tensor,
    log_norm: torch.Tensor | None,
) -> torch.Tensor:
    """Sample one token per row of logits (rows, V), each constrained row inside its answers.
    log_norm: the logits' T=1 log-normaliser ([rows, 1]), computed once for the draw and the log-probs."""
    constrained = list(allowed_of.items())
    if not constrained:
        return sample(logits, temperatures, top_ps, uniforms, log_norm)
    if len(constrained) == len(runs):
        # Every live row is choosing among a few answers: sample over the union of their allowed
        # tokens (rows, K) instead of the whole vocabulary. Same draws: masked tokens have p = 0.
        columns = sorted({t for _, allowed in constrained for t in allowed})
        index = {t: i for i, t in enumerate(columns)}
        keep = torch.zeros(logits.shape[0], len(columns), dtype=torch.bool, device=logits.device)
        for row, allowed in constrained:
            keep[row, [index[t] for t in allowed]] = True
        sub = logits[:, columns].masked_fill(~keep, float("-inf"))
        return torch.tensor(columns, device=logits.device)[sample(sub, temperatures, top_ps, uniforms)]
    masked = logits.clone()
    for row, allowed in constrained:
        keep_row = masked[row, allowed].clone()
        masked[row] = float("-inf")
        masked[row, allowed] = keep_row
    return sample(masked, temperatures, top_ps, uniforms)


def _logprobs(
    logits: torch.Tensor, picked: torch.Tensor, allowed_of: dict[int, list[int]], log_norm: torch.Tensor | None
) -> list[float]:
    """Log-probability (T=1) of each drawn token in the distribution its row draws from: the whole
    vocabulary, or only the allowed tokens of a constrained row (so P(Yes) + P(No) = 1)."""
    norm = log_norm.squeeze(-1).clone() if log_norm is not None else logits.new_empty(logits.shape[0])
    for row, allowed in allowed_of.items():
        norm[row] = torch.logsumexp(logits[row, allowed], dim=-1)
    return (logits.gather(1, picked[:, None]).squeeze(1) - norm).tolist()


def draw(logits: torch.Tensor, seqs: Seq[Sequence], eos_id: int) -> tuple[list[int], list[float]]:
    """One token per row of logits (N, V) for the sequence of that row, and its log-probability:
    temperatures, top-ps and uniforms are per-row tensors, drawn in one vectorised call."""
    device = logits.device
    temperatures = torch.tensor([s.params.temperature for s in seqs], device=device)
    top_ps = torch.tensor([s.params.top_p for s in seqs], device=device)
    uniforms = torch.tensor([s.rng.random() for s in seqs], device=device)
    allowed_of = {i: _allowed(s.node, eos_id) for i, s in enumerate(seqs) if s.node is not None}
    # Over the whole vocabulary unless every row is constrained (then each row's own answers).
    log_norm = log_normaliser(logits) if len(allowed_of) < len(seqs) else None
    picked = _draw(logits, seqs, allowed_of, temperatures, top_ps, uniforms, log_norm)
    return picked.tolist(), _logprobs(logits, picked, allowed_of, log_norm)
