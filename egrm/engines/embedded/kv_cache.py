"""Where KV lives: one pool of fixed-size blocks for every sequence, and the manager that hands them out.

The pool is preallocated from a memory budget (EGRM_KV_CACHE_MB): per layer, K and V tensors of
(kv_heads, blocks * block_size, head_dim). A sequence's block table puts the KV of its token i in
slot `blocks[i // block_size] * block_size + i % block_size`. Blocks are shared, counted by
references:
- the M branches of a request share the prompt's full blocks (a partly filled last one is copied);
- requests whose prompts start alike share that head's blocks: a full, computed block is keyed by
  its tokens and the key of the block before it (a hash chain), and a new prompt takes the keyed
  blocks it starts with instead of computing them (the embedded counterpart of SGLang's radix cache).
A block nobody holds is free but keeps its key and KV until it is reused for other tokens. Free
blocks are reused least recently freed first, so the heads that come back most stay cached.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from collections.abc import Sequence as Seq

import torch

from egrm.engines.embedded.sequence import Sequence

BLOCK_SIZE = 16


def by_block(kv: torch.Tensor, block_size: int) -> torch.Tensor:
    """A layer's pool tensor (2, KVH, slots, hd) seen as (2, KVH, blocks, block_size, hd): a view,
    so whole blocks are gathered, copied or filled with one index along axis 2."""
    two, kv_heads, slots, hd = kv.shape
    return kv.view(two, kv_heads, slots // block_size, block_size, hd)


def _chain(previous: int, tokens: Seq[int]) -> int:
    # Python's hash of ints and tuples is not salted: the same tokens give the same key all run long.
    return hash((previous, tuple(tokens)))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int = BLOCK_SIZE, prefix_cache: bool = True):
        if num_blocks < 1:
            raise ValueError(f"the KV pool must hold at least one block, got {num_blocks}")
        self.num_blocks, self.block_size, self.prefix_cache = num_blocks, block_size, prefix_cache
        self._refs = [0] * num_blocks
        self._key_of: list[int | None] = [None] * num_blocks
        self._by_key: dict[int, int] = {}
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # reused first..last
        self.hit_tokens = 0  # prompt tokens served from keyed blocks, not computed

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def needed(self, seq: Sequence, tokens: int) -> int:
        """New blocks seq needs to hold `tokens` tokens."""
        return max(0, self.blocks_for(tokens) - len(seq.blocks))

    def slot(self, seq: Sequence, position: int) -> int:
        return seq.blocks[position // self.block_size] * self.block_size + position % self.block_size

    def reuse_prefix(self, seq: Sequence) -> None:
        """For a sequence that holds no blocks: take the keyed blocks its tokens start with. Its last
        token is always computed, since its logits are what the sequence samples from next."""
        if not self.prefix_cache or seq.blocks:
            return
        size, key = self.block_size, 0
        for j in range((len(seq.tokens) - 1) // size):
            key = _chain(key, seq.tokens[j * size : (j + 1) * size])
            block = self._by_key.get(key)
            if block is None:
                break
            if self._refs[block] == 0:
                del self._free[block]
            self._refs[block] += 1
            seq.blocks.append(block)
            seq.keys.append(key)
        seq.computed = len(seq.blocks) * size

    def allocate(self, seq: Sequence, tokens: int) -> None:
        """Give seq fresh blocks until it can hold `tokens` tokens (the caller checked `needed`)."""
        for _ in range(self.needed(seq, tokens)):
            block, _ = self._free.popitem(last=False)
            self._forget(block)
            self._refs[block] = 1
            seq.blocks.append(block)

    def commit(self, seq: Sequence) -> None:
        """Key the blocks seq has filled and computed: from now on they never change."""
        if not self.prefix_cache:
            return
        size = self.block_size
        while len(seq.keys) < seq.computed // size:
            j = len(seq.keys)
            key = _chain(seq.keys[-1] if seq.keys else 0, seq.tokens[j * size : (j + 1) * size])
            seq.keys.append(key)
            block = seq.blocks[j]
            if key not in self._by_key and self._key_of[block] is None:
                self._by_key[key], self._key_of[block] = block, key

    def fork(self, leader: Sequence, followers: list[Sequence]) -> list[tuple[int, int]]:
        """Share the leader's computed blocks with followers that each hold one spare block: full
        blocks by reference; a partly filled last block is copied into the spare. Returns the
        (source, destination) blocks whose KV the caller must copy."""
        full = leader.computed // self.block_size
        copies = []
        for seq in followers:
            for block in leader.blocks[:full]:
                self._refs[block] += 1
            seq.blocks = leader.blocks[:full] + seq.blocks
            seq.keys = list(leader.keys[:full])
            seq.computed = leader.computed
            if len(leader.blocks) > full:
                copies.append((leader.blocks[full], seq.blocks[full]))
        return copies

    def release(self, seq: Sequence) -> None:
        """Drop seq's blocks; its computed KV is gone for it (a keyed block may still serve others)."""
        for block in reversed(seq.blocks):  # the tail first: the head, shared most, stays cached longest
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._free[block] = None
                if self._key_of[block] is None:  # nothing anyone can reuse: hand it out first
                    self._free.move_to_end(block, last=False)
        seq.blocks, seq.keys, seq.computed, seq.kv = [], [], 0, None

    def _forget(self, block: int) -> None:
        key = self._key_of[block]
        if key is not None:
            del self._by_key[key]
            self._key_of[block] = None


class KVPool:
    """The K and V of every block, per layer: one (2, kv_heads, blocks * block_size, head_dim)
    tensor, K at [0] and V at [1], so a step writes and gathers both in one call per layer."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, blocks: int, block_size: int, dtype, device):
        shape = (2, kv_heads, blocks * block_size, head_dim)
        # Not zeroed here (that would commit all of the budget's memory at start): see readable().
        self.kv = [torch.empty(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.block_size = block_size
        self._finite = [False] * blocks  # whether a block's every slot holds a finite value

    def readable(self, blocks: Iterable[int]) -> None:
        """Zero the blocks among these that were never used. The forward reads whole blocks; the
        slots past a sequence's last token are masked out, but must be finite (0 x NaN is NaN).
        Once zeroed a block stays finite: what a step writes into it is K and V."""
        fresh = [b for b in blocks if not self._finite[b]]
        if not fresh:
            return
        for b in fresh:
            self._finite[b] = True
        index = torch.tensor(fresh, device=self.kv[0].device)
        for t in self.kv:
            by_block(t, self.block_size).index_fill_(2, index, 0)

    @staticmethod
    def bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: (T, kv_heads, head_dim) for the T slots given."""
        self.kv[layer].index_copy_(2, slots, torch.stack((k, v)).transpose(1, 2))

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        if not pairs:
            return
        device = self.kv[0].device
        src = torch.tensor([b for b, _ in pairs], device=device)
        dst = torch.tensor([b for _, b in pairs], device=device)
        for t in self.kv:
            blocks = by_block(t, self.block_size)
            blocks.index_copy_(2, dst, blocks.index_select(2, src))
        for source, destination in pairs:  # a copy of a block a step has read: finite, not to be zeroed
            self._finite[destination] = self._finite[source]
