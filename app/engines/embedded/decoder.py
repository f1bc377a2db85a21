"""The decode loop: sample -> check finish -> feed back, one token per active row per step."""

from __future__ import annotations

import random
from collections.abc import Callable, Generator, Sequence
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


def _allowed(node: TrieNode, eos_id: int) -> list[int]:
    return list(node.children) + ([eos_id] if node.terminal else [])


def _draw(
    logits: torch.Tensor,
    runs: Sequence[RowRun],
    allowed_of: dict[int, list[int]],
    temperatures: torch.Tensor,
    top_ps: torch.Tensor,
    uniforms: torch.Tensor,
) -> torch.Tensor:
    """Sample one token per row of logits (rows, V), each constrained row inside its answers."""
    constrained = list(allowed_of.items())
    if not constrained:
        return sample(logits, temperatures, top_ps, uniforms)
    if len(constrained) == len(runs):
        # Every live row is choosing among a few answers: sample over the union of their allowed
        # tokens (rows, K) instead of the whole vocabulary. Same draws: masked tokens have p = 0.
        columns = sorted({t for _, allowed in constrained for t in allowed})
        index = {t: i for i, t in enumerate(columns)}
        # Rows not being decoded keep every column, so no row is all -inf (its draw is ignored).
        keep = torch.ones(logits.shape[0], len(columns), dtype=torch.bool, device=logits.device)
        for row, allowed in constrained:
            keep[row] = False
            keep[row, [index[t] for t in allowed]] = True
        sub = logits[:, columns].masked_fill(~keep, float("-inf"))
        return torch.tensor(columns, device=logits.device)[sample(sub, temperatures, top_ps, uniforms)]
    masked = logits.clone()
    for row, allowed in constrained:
        keep_row = masked[row, allowed].clone()
        masked[row] = float("-inf")
        masked[row, allowed] = keep_row
    return sample(masked, temperatures, top_ps, uniforms)


def _logprobs(logits: torch.Tensor, picked: torch.Tensor, allowed_of: dict[int, list[int]]) -> list[float]:
    """Log-probability (T=1) of each drawn token in the distribution its row draws from: the whole
    vocabulary, or only the allowed tokens of a constrained row (so P(Yes) + P(No) = 1)."""
    norm = torch.logsumexp(logits, dim=-1)  # (rows,)
    for row, allowed in allowed_of.items():
        norm[row] = torch.logsumexp(logits[row, allowed], dim=-1)
    return (logits.gather(1, picked[:, None]).squeeze(1) - norm).tolist()


def _finish_reason(run: RowRun, tokenizer: PreTrainedTokenizerBase) -> FinishReason | None:
    """Whether (and why) the branch is done after its latest token."""
    if run.node is not None:
        run.node = run.node.children[run.tokens[-1]]
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


Feed = list[list[int]]  # per fork row: the tokens to append (empty: the row sits this step out)


def decode_steps(
    fork: Fork,
    tokenizer: PreTrainedTokenizerBase,
    eos_ids: frozenset[int],
    rows: Sequence[int],
    params: Sequence[BranchParams],
    logits: torch.Tensor,
    abandoned: Callable[[], set[int]] | None = None,
) -> Generator[Feed, torch.Tensor, list[RowRun]]:
    """Decode the given fork rows together until each finishes; logits (M, V) start the loop.

    Instead of running the forward itself, it yields what to feed and receives the next logits:
    the model thread can then run one forward for every round on the same fork, and admit new
    requests between steps.
    """
    runs = [_start(tokenizer, row, p) for row, p in zip(rows, params, strict=True)]
    eos_id = min(eos_ids)
    device = logits.device
    temperatures = torch.zeros(fork.rows, device=device)
    top_ps = torch.ones(fork.rows, device=device)
    for r in runs:
        temperatures[r.row], top_ps[r.row] = r.params.temperature, r.params.top_p
    active = list(runs)
    position = {id(r): i for i, r in enumerate(runs)}
    while active:
        if abandoned is not None and (gone := abandoned()):
            for r in active:
                if position[id(r)] in gone:
                    r.finish = FinishReason.LENGTH  # nobody reads it; stop paying for it
            active = [r for r in active if position[id(r)] not in gone]
            if not active:
                break
        draws = [0.0] * fork.rows
        for r in active:
            draws[r.row] = r.rng.random()
        uniforms = torch.tensor(draws, device=device)
        allowed_of = {r.row: _allowed(r.node, eos_id) for r in active if r.node is not None}
        picked = _draw(logits, active, allowed_of, temperatures, top_ps, uniforms)
        chosen = _logprobs(logits, picked, allowed_of)
        tokens = picked.tolist()
        feed: list[list[int]] = [[] for _ in range(fork.rows)]
        still: list[RowRun] = []
        for r in active:
            token = tokens[r.row]
            if token in eos_ids and not r.params.ignore_eos:
                r.finish = FinishReason.STOP  # EOS is not part of the branch's text or tokens
                fork.pending[r.row] = []
                continue
            r.tokens.append(token)
            r.logprobs.append(chosen[r.row])
            r.finish = _finish_reason(r, tokenizer)
            if r.finish is None:
                feed[r.row] = [token]
                still.append(r)
            else:  # the last token's KV is computed only if the branch is continued
                fork.pending[r.row] = [token]
        active = still
        if active:
            logits = yield feed
    for r in runs:
        if r.text is None:
            r.text = decode_text(tokenizer, r.tokens)
    return runs
