"""The block manager: prefix blocks shared by reference, keyed heads reused across requests, LRU reuse.
The pool: blocks made finite before they are first read, copies kept."""

import torch

from egrm.engines.base import BranchParams
from egrm.engines.embedded.kv_cache import BlockManager, KVPool
from egrm.engines.embedded.sequence import Sequence


def seq(tokens: list[int]) -> Sequence:
    return Sequence(list(tokens), BranchParams(), group=0)


def computed(blocks: BlockManager, tokens: list[int]) -> Sequence:
    """A sequence whose tokens are all in its blocks, keyed."""
    s = seq(tokens)
    blocks.allocate(s, len(tokens))
    s.computed = len(tokens)
    blocks.commit(s)
    return s


def test_a_prompt_takes_the_keyed_blocks_it_starts_with_and_computes_its_last_token():
    blocks = BlockManager(16)
    a = computed(blocks, list(range(40)))  # two full blocks keyed, one partial
    b = seq(list(range(35)) + [99] * 10)
    blocks.reuse_prefix(b)
    assert b.blocks == a.blocks[:2] and b.computed == 32
    exact = seq(list(range(32)))  # both blocks match, but its last token must be computed
    blocks.reuse_prefix(exact)
    assert exact.blocks == a.blocks[:1] and exact.computed == 16
    other = seq([7] + list(range(1, 40)))
    blocks.reuse_prefix(other)
    assert other.blocks == [] and other.computed == 0  # keys chain: a different first block, no match


def test_released_blocks_keep_their_keys_until_reused_least_recently_freed_first():
    blocks = BlockManager(4)
    a = computed(blocks, list(range(33)))  # blocks: 2 keyed + 1 partial (unkeyed)
    keyed = a.blocks[:2]
    blocks.release(a)
    assert blocks.free == 4 and blocks.used == 0
    fresh = seq([5] * 16)
    blocks.allocate(fresh, 16)
    blocks.allocate(fresh, 32)
    assert not set(fresh.blocks) & set(keyed)  # unkeyed blocks go first
    again = seq(list(range(40)))
    blocks.reuse_prefix(again)
    assert again.blocks == keyed and again.computed == 32
    blocks.release(again)
    blocks.allocate(fresh, 64)  # the pool is full now: keyed blocks are taken and forgotten
    late = seq(list(range(40)))
    blocks.reuse_prefix(late)
    assert late.blocks == []


def test_a_fork_shares_full_blocks_and_copies_a_partial_one():
    blocks = BlockManager(8)
    leader = computed(blocks, list(range(40)))
    followers = [seq(list(range(40))) for _ in range(2)]
    for f in followers:
        blocks.allocate(f, 1)  # the spare each follower got at admission
    copies = blocks.fork(leader, followers)
    assert copies == [(leader.blocks[2], f.blocks[2]) for f in followers]
    for f in followers:
        assert f.blocks[:2] == leader.blocks[:2] and f.computed == 40
    assert blocks.used == 3 + 2
    for s in [leader, *followers]:
        blocks.release(s)
    assert blocks.free == 8


def test_an_aligned_prompt_forks_without_copies():
    blocks = BlockManager(8)
    leader = computed(blocks, list(range(32)))
    follower = seq(list(range(32)))
    blocks.allocate(follower, 1)
    spare = follower.blocks[0]
    assert blocks.fork(leader, [follower]) == []
    assert follower.blocks == leader.blocks + [spare]  # the spare holds its first new token
    assert blocks.slot(follower, 32) == spare * blocks.block_size


def test_the_pool_zeroes_a_block_once_before_it_is_first_read_and_keeps_copies():
    pool = KVPool(layers=2, kv_heads=1, head_dim=4, blocks=3, block_size=2, dtype=torch.float32, device="cpu")
    for t in pool.kv:
        t.fill_(float("nan"))  # what unused memory may hold
    pool.readable([0])
    k, v = torch.ones(2, 1, 1, 4).unbind(0)
    pool.write(0, torch.tensor([0]), k, v)  # slot 0 written, slot 1 (block 0) left zero
    assert torch.equal(pool.kv[0][:, :, :2], torch.tensor([[[1.0] * 4, [0.0] * 4]] * 2)[:, None])
    pool.readable([0])  # already finite: what was written stays
    assert pool.kv[0][0, 0, 0, 0] == 1
    pool.copy_blocks([(0, 1)])  # a fork's partial block copied into a spare nobody read yet
    pool.readable([1])
    assert torch.equal(pool.kv[0][:, :, 2:4], pool.kv[0][:, :, :2])  # the copy is not zeroed
    assert torch.isnan(pool.kv[1][:, :, 4:]).all()  # block 2: never read, never touched
