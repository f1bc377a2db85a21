"""Branches of one or more requests on the lean KV cache, in one of two layouts.

- sequence: one cache row per request. The prefix fills the first slots once; each decode step
  appends one slot per live branch. A branch's queries see the prefix and their own slots
  only (owner mask), and each carries its own RoPE position, so all branches of a step sit at
  `prefix_len + step`. The prefix KV is stored once, never copied.
- batch: one cache row per branch. The prefix is prefilled once per request, then its row
  is copied to the request's M branch rows.

Both expose what the decode loop needs: `rows` (branches), `extend`, `pending`, `lengths`,
`last_logits`, the same contract as the generic `ForkState`.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

import torch

from app.engines.embedded.lean_llama import LeanLlama
from app.engines.embedded.prefix_cache import PrefixCache

SHARED = -1  # a prefix slot: every branch of the row sees it
FREE = -2  # not (yet) holding a real token: nobody sees it
PADDING = -3  # the owner of a padding query: it sees slot 0 only, so its softmax is never empty


class Layout(str, Enum):
    BATCH = "batch"
    SEQUENCE = "sequence"


class PackedFork:
    def __init__(
        self,
        lean: LeanLlama,
        groups: Sequence[tuple[Sequence[int], int]],
        layout: Layout,
        pad_id: int,
        reserve: int = 32,
        prefix_cache: PrefixCache | None = None,
    ):
        """groups: (prefix token ids, number of branches) per request, prefilled together.

        With a prefix cache, each request's longest known head is copied in, not recomputed.
        """
        self.lean, self.pad_id = lean, pad_id
        device = lean.device
        self.group_of = [g for g, (_, n) in enumerate(groups) for _ in range(n)]  # branch -> request
        self.rows = len(self.group_of)
        prefix_lens = [len(p) for p, _ in groups]
        longest = max(prefix_lens)
        per_row_new = reserve * (max(n for _, n in groups) if layout is Layout.SEQUENCE else 1)
        self.cache = lean.new_cache(len(groups), longest + per_row_new + 1)
        self.owner = torch.full((len(groups), self.cache.capacity), FREE, dtype=torch.int32, device=device)
        self.fill = [0] * len(groups)  # next free slot per cache row
        self.reused = [0] * len(groups)  # per request: prefix tokens served from the prefix cache
        if prefix_cache is not None:
            for g, (p, _) in enumerate(groups):
                self.reused[g], head = prefix_cache.lookup(p)
                if head is not None:
                    PrefixCache.copy_into(head, self.cache, g)
                    self.owner[g, : self.reused[g]] = SHARED
                    self.fill[g] = self.reused[g]
        rest = [(g, list(p[self.reused[g] :]), SHARED, self.reused[g]) for g, (p, _) in enumerate(groups)]
        logits = self._write(rest)  # (groups, V)
        if prefix_cache is not None:
            for g, (p, _) in enumerate(groups):
                prefix_cache.learn(p, self.cache, g)
        if layout is Layout.BATCH:
            # One prefill per request, copied to its branch rows: (groups, ...) -> (branches, ...).
            index = torch.tensor(self.group_of, device=device)
            self.cache.select_rows(index)
            self.owner = self.owner.index_select(0, index)
            self.owner[self.owner == SHARED] = 0  # in its own row, every slot is the branch's own
            self.fill = [self.fill[g] for g in self.group_of]
            self.branch_row = list(range(self.rows))
            self.branch_owner = [0] * self.rows
        else:
            self.branch_row = list(self.group_of)
            self.branch_owner = [sum(1 for x in self.group_of[:b] if x == g) for b, g in enumerate(self.group_of)]
        self.lengths = [prefix_lens[g] for g in self.group_of]  # tokens each branch attends to
        self.pending: list[list[int]] = [[] for _ in range(self.rows)]  # sampled, not yet in the cache
        self.last_logits = logits.index_select(0, torch.tensor(self.group_of, device=device))  # (branches, V)

    def extend(self, new_ids: Sequence[Sequence[int]]) -> torch.Tensor:
        """Feed each branch its own tokens (possibly none); return next-token logits (branches, V)."""
        writes = []
        fed = []
        for b, ids in enumerate(new_ids):
            if ids:
                writes.append((self.branch_row[b], list(ids), self.branch_owner[b], self.lengths[b]))
                self.lengths[b] += len(ids)
                fed.append(b)
        if not writes:
            return self.last_logits
        logits = self._write(writes)
        self.last_logits = self.last_logits.clone()
        self.last_logits[torch.tensor(fed, device=logits.device)] = logits
        return self.last_logits

    def _write(self, writes: Sequence[tuple[int, list[int], int, int]]) -> torch.Tensor:
        """Run one forward for (row, tokens, owner, first position) writes; logits of each write's last token."""
        per_row: dict[int, int] = {}
        for row, toks, _, _ in writes:
            per_row[row] = per_row.get(row, 0) + len(toks)
        self._reserve(max(self.fill[r] + n + 1 for r, n in per_row.items()))
        # Only rows that get tokens take part: a continuation of 4 requests in a fork of 25 must
        # not pay for 21 rows of padding queries.
        rows = sorted(per_row)
        local = {row: i for i, row in enumerate(rows)}
        width = max(per_row.values())
        device = self.owner.device
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        positions = torch.zeros(len(rows), width, dtype=torch.long)
        slots = torch.zeros(len(rows), width, dtype=torch.long)
        q_owner = torch.full((len(rows), width), PADDING, dtype=torch.int32)
        used = [0] * len(rows)
        last = []
        for row, toks, owner, start in writes:
            i = local[row]
            n, col, slot = len(toks), used[i], self.fill[row]
            ids[i, col : col + n] = torch.tensor(toks)
            positions[i, col : col + n] = torch.arange(start, start + n)
            slots[i, col : col + n] = torch.arange(slot, slot + n)
            q_owner[i, col : col + n] = owner
            self.owner[row, slot : slot + n] = owner
            self.fill[row] += n
            used[i] += n
            last.append(i * width + col + n - 1)
        for row, i in local.items():
            # Padding queries write to the row's next free slot (owned by nobody, overwritten later).
            slots[i, used[i] :] = self.fill[row]
        span = max(self.fill[row] for row in rows) + 1
        keys = torch.arange(span)
        owners = self.owner[rows, :span].cpu()
        visible = (owners[:, None, :] == SHARED) | (owners[:, None, :] == q_owner[:, :, None])
        visible |= (q_owner[:, :, None] == PADDING) & (keys == 0)
        mask = visible & (keys[None, None, :] <= slots[:, :, None])  # (rows, width, span)
        return self.lean.forward(
            ids.to(device),
            positions.to(device),
            slots.to(device),
            mask[:, None].to(device),
            self.cache,
            torch.tensor(last, device=device),
            None if len(rows) == self.cache.rows else torch.tensor(rows, device=device),
        )

    def _reserve(self, slots: int) -> None:
        if slots > self.cache.capacity:
            capacity = max(slots, 2 * self.cache.capacity)
            self.cache.grow(capacity)
            extra = torch.full((self.owner.shape[0], capacity - self.owner.shape[1]), FREE, dtype=self.owner.dtype)
            self.owner = torch.cat([self.owner, extra.to(self.owner.device)], dim=1)

    @property
    def allocated_bytes(self) -> int:
        """Bytes of K/V allocated for this fork, all layers (what it holds in memory)."""
        return self.cache.nbytes

    @property
    def kv_bytes(self) -> int:
        """Bytes of K/V holding real tokens (prefix and branches), all layers."""
        per_slot = self.cache.nbytes // (self.cache.rows * self.cache.capacity)
        return per_slot * sum(self.fill)
