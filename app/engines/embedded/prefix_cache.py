"""KV of the token prefixes that many requests share, computed once and reused.

Every judge prompt starts with the same head (chat markup, system prompt, the first words of the
user turn). The cache learns such heads by itself: after each prefill it compares the prompt
with the last few prompts it saw, and when they share at least `min_tokens` leading tokens it
keeps the KV of that common part. Later prompts starting with a kept head prefill only the rest.
Like SGLang's radix cache, but for the few long-lived heads a reward service sees.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence

import torch

from app.engines.embedded.lean_llama import KVCache

# Per layer: (K, V), each (KVH, L, hd).
HeadKV = list[tuple[torch.Tensor, torch.Tensor]]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class PrefixCache:
    def __init__(self, max_entries: int = 8, min_tokens: int = 16, history: int = 8):
        self.max_entries = max_entries
        self.min_tokens = min_tokens
        self.entries: OrderedDict[tuple[int, ...], HeadKV] = OrderedDict()
        self.recent: deque[tuple[int, ...]] = deque(maxlen=history)
        self.hits = 0
        self.hit_tokens = 0

    def lookup(self, ids: Sequence[int]) -> tuple[int, HeadKV | None]:
        """The longest kept head that is a proper prefix of ids (one token is left to prefill)."""
        best: tuple[int, ...] | None = None
        for key in self.entries:
            if len(key) < len(ids) and (best is None or len(key) > len(best)) and tuple(ids[: len(key)]) == key:
                best = key
        if best is None:
            return 0, None
        self.entries.move_to_end(best)
        self.hits += 1
        self.hit_tokens += len(best)
        return len(best), self.entries[best]

    def learn(self, ids: Sequence[int], cache: KVCache, row: int) -> None:
        """Remember the head ids share with a recent prompt; its KV sits in slots [0, L) of row."""
        key = tuple(ids)
        shared = max((common_prefix(key, other) for other in self.recent), default=0)
        self.recent.append(key)
        if shared < self.min_tokens or key[:shared] in self.entries:
            return
        self.entries[key[:shared]] = [
            (k[row, :, :shared].clone(), v[row, :, :shared].clone())
            for k, v in zip(cache.keys, cache.values, strict=True)
        ]
        while len(self.entries) > self.max_entries:
            self.entries.popitem(last=False)

    @staticmethod
    def copy_into(head: HeadKV, cache: KVCache, row: int) -> None:
        for (k, v), keys, values in zip(head, cache.keys, cache.values, strict=True):
            keys[row, :, : k.shape[1]] = k
            values[row, :, : v.shape[1]] = v
