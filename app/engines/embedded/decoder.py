"""The decode loop: sample -> check finish -> feed back, one token per active row per step."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers import PreTrainedTokenizerBase

from app.engines.base import BranchParams, FinishReason
from app.engines.embedded.constraint import TrieNode, build_trie
from app.engines.embedded.sampler import sample


class Fork(Protocol):
    """What the loop needs of a fork: its branch rows, their pending tokens, and a step."""

    rows: int
    pending: list[list[int]]

    def extend(self, new_ids: Sequence[Sequence[int]]) -> torch.Tensor: ...


@dataclass(slots=True)
class RowRun:
    """One branch being decoded on one fork row."""

    row: int
    params: BranchParams
    rng: random.Random
    node: TrieNode | None  # position in the allowed-answer trie, None when unconstrained
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str | None = None  # set at a stop string; decoded from tokens otherwise
    finish: FinishReason | None = None


def decode_text(tokenizer: PreTrainedTokenizerBase, tokens: Sequence[int]) -> str:
    return str(tokenizer.decode(list(tokens), skip_special_tokens=True))


def _start(tokenizer: PreTrainedTokenizerBase, row: int, params: BranchParams) -> RowRun:
    rng = random.Random(params.seed) if params.seed is not None else random.Random()
    node = build_trie(tokenizer, params.allowed) if params.allowed is not None else None
    return RowRun(row, params, rng, node)


def _constrain(logits: torch.Tensor, runs: Sequence[RowRun], eos_id: int) -> torch.Tensor:
    """Mask each constrained row to the tokens that keep it inside an allowed answer."""
    constrained = [(r.row, r.node) for r in runs if r.node is not None]
    if not constrained:
        return logits
    logits = logits.clone()
    for row, node in constrained:
        allowed = list(node.children) + ([eos_id] if node.terminal else [])
        keep = logits[row, allowed].clone()
        logits[row] = float("-inf")
        logits[row, allowed] = keep
    return logits


def _finish_reason(
    run: RowRun, token: int, eos_ids: frozenset[int], tokenizer: PreTrainedTokenizerBase
) -> FinishReason | None:
    """Record the token on the run; say whether (and why) the branch is now done."""
    if token in eos_ids:
        return FinishReason.STOP  # EOS is not part of the branch's text or tokens
    run.tokens.append(token)
    if run.node is not None:
        run.node = run.node.children[token]
        if run.node.is_leaf:
            return FinishReason.STOP
    if run.params.stop:
        text = decode_text(tokenizer, run.tokens)
        hits = [text.find(s) for s in run.params.stop if s in text]
        if hits:
            run.text = text[: min(hits)]
            return FinishReason.STOP
    if len(run.tokens) >= run.params.max_new_tokens:
        return FinishReason.LENGTH
    return None


def decode(
    fork: Fork,
    tokenizer: PreTrainedTokenizerBase,
    eos_ids: frozenset[int],
    rows: Sequence[int],
    params: Sequence[BranchParams],
    logits: torch.Tensor,
) -> list[RowRun]:
    """Decode the given fork rows together until each finishes; logits (M, V) start the loop."""
    runs = [_start(tokenizer, row, p) for row, p in zip(rows, params, strict=True)]
    eos_id = min(eos_ids)
    device = logits.device
    temperatures = torch.zeros(fork.rows, device=device)
    top_ps = torch.ones(fork.rows, device=device)
    for r in runs:
        temperatures[r.row], top_ps[r.row] = r.params.temperature, r.params.top_p
    active = list(runs)
    while active:
        uniforms = torch.zeros(fork.rows, device=device)
        for r in active:
            uniforms[r.row] = r.rng.random()
        tokens = sample(_constrain(logits, active, eos_id), temperatures, top_ps, uniforms).tolist()
        log_probs = torch.log_softmax(logits, dim=-1)  # the model's own distribution (T=1)
        feed: list[list[int]] = [[] for _ in range(fork.rows)]
        still: list[RowRun] = []
        for r in active:
            token = tokens[r.row]
            r.finish = _finish_reason(r, token, eos_ids, tokenizer)
            if token not in eos_ids:
                r.logprobs.append(float(log_probs[r.row, token]))
            if r.finish is None:
                feed[r.row] = [token]
                still.append(r)
            else:  # the last token's KV is computed only if the branch is continued
                fork.pending[r.row] = [] if token in eos_ids else [token]
        active = still
        if active:
            logits = fork.extend(feed)
    for r in runs:
        if r.text is None:
            r.text = decode_text(tokenizer, r.tokens)
    return runs
