"""The lean forward's fast paths compute what the plain ones do: prepacked weights, decode attention."""

import pytest
import torch
import torch.nn.functional as F

from egrm.engines.embedded.attention import DenseRow, PaddedRows, StepInputs
from egrm.engines.embedded.kv_cache import KVPool
from egrm.engines.embedded.lean_llama import LeanLlama
from egrm.engines.embedded.loader import load_model
from egrm.engines.embedded.prepacked import Linear, prepack_supported


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 5, 40])
def test_prepacked_linear_equals_f_linear(dtype, rows):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(960, 576, generator=gen).to(dtype)
    x = torch.randn(2, rows, 576, generator=gen).to(dtype)
    linear = Linear(weight)
    # oneDNN ships with the CPU build of torch; its bf16 kernels need a CPU with native bf16.
    assert linear.prepacked == prepack_supported(dtype)
    assert linear.prepacked or dtype is torch.bfloat16
    expected = F.linear(x, weight)
    # Another kernel (oneDNN's prepacked one; F.linear takes a gemv path for one row on some CPUs)
    # sums in another order: equal to a few units of the last place, bf16's (2^-8) or fp32's.
    last_place = 2**-8 if dtype is torch.bfloat16 else 2**-20
    tolerance = 4 * last_place * expected.abs().max().item()
    torch.testing.assert_close(linear(x), expected, rtol=0, atol=tolerance)
    assert not Linear(weight, prepack=False).prepacked
    assert torch.equal(Linear(weight, prepack=False)(x), expected)


def _plain_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q (Q, H, hd), k and v (KVH, U, hd), mask (Q, U): softmax(q k^T / sqrt(hd)) v, the KV heads repeated."""
    groups = q.shape[1] // k.shape[0]
    k, v = k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0)  # (H, U, hd)
    scores = torch.einsum("qhd,hud->hqu", q, k) / q.shape[-1] ** 0.5
    weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    return torch.einsum("hqu,hud->qhd", weights, v)


@pytest.mark.parametrize("counts", [[1] * 5, [5], [7, 7], [3, 1, 2]])
def test_padded_and_dense_attention_equal_the_plain_formula(counts):
    """Rows of `counts` queries each, after two tokens of another row in the flat order; padded
    to the widest row where they differ."""
    gen = torch.Generator().manual_seed(sum(counts))
    heads, kv_heads, hd, size, blocks = 9, 3, 64, 4, 6
    rows, widest, before = len(counts), max(counts), 2
    kv = torch.randn(2, kv_heads, 40 * size, hd, generator=gen)  # a pool of 40 blocks; each row reads some
    q = torch.randn(before + sum(counts), heads, hd, generator=gen)  # flat, row after row
    row_blocks = torch.stack([torch.randperm(40, generator=gen)[:blocks] for _ in range(rows)])  # (S, B)
    mask = torch.rand(rows, widest, blocks * size, generator=gen) < 0.6
    mask[..., 0] = True  # every query sees at least one key, as in the engine
    starts = [before + sum(counts[:s]) for s in range(rows)]
    query_index = torch.tensor([starts[s] + min(i, counts[s] - 1) for s in range(rows) for i in range(widest)])
    out_index = torch.tensor([s * widest + i for s in range(rows) for i in range(counts[s])])
    padded = PaddedRows.build(
        query_index, row_blocks.flatten(), mask, out_index, size, torch.float32, heads // kv_heads
    )
    got = padded.attend(q, kv)
    for s in range(rows):
        slots = (row_blocks[s][:, None] * size + torch.arange(size)).flatten()
        k, v = kv[0][:, slots], kv[1][:, slots]
        mine = slice(starts[s], starts[s] + counts[s])
        expected = _plain_attention(q[mine], k, v, mask[s, : counts[s]])
        torch.testing.assert_close(got[mine.start - before : mine.stop - before], expected, rtol=1e-5, atol=1e-5)
        dense = DenseRow(mine.start, mine.stop, row_blocks[s], size, mask[s, : counts[s]][None, None])
        torch.testing.assert_close(dense.attend(q, kv), expected, rtol=1e-5, atol=1e-5)


def test_masked_slots_of_a_fresh_block_never_reach_the_output():
    """A row reads whole blocks; slots no token has written are masked, and the pool makes them
    finite before a block is first read, whatever the memory held (NaN here)."""
    pool = KVPool(layers=1, kv_heads=1, head_dim=8, blocks=2, block_size=4, dtype=torch.float32, device="cpu")
    pool.kv[0].fill_(float("nan"))
    pool.readable([1])
    k, v = torch.randn(2, 1, 1, 8).unbind(0)  # one token written at slot 4 (block 1)
    pool.write(0, torch.tensor([4]), k, v)
    mask = torch.tensor([[True, False, False, False]])  # it sees itself only
    row = DenseRow(0, 1, torch.tensor([1]), 4, mask[None, None])
    out = row.attend(torch.randn(1, 1, 8), pool.kv[0])
    torch.testing.assert_close(out, v)  # one visible key: the output is its value
    assert torch.isnan(pool.kv[0][:, :, :4]).all()  # a block nobody read is left as it was


@pytest.mark.slow
def test_prepacked_forward_gives_the_same_logits(model_path):
    loaded = load_model(model_path, dtype="bfloat16")
    fast, plain = LeanLlama(loaded.model), LeanLlama(loaded.model, prepack=False)
    ids = torch.tensor(loaded.tokenizer.encode("The judge reads the answer and"))
    n = ids.shape[0]
    outs = []
    for lean in (fast, plain):
        pool = KVPool(len(lean.layers), lean.kv_heads, lean.head_dim, 1, 16, lean.dtype, lean.device)
        pool.readable([0])
        causal = torch.ones(n, 16, dtype=torch.bool).tril()[None, None]  # the block's 16 keys
        attention = [DenseRow(0, n, torch.tensor([0]), 16, causal)]
        outs.append(
            lean.forward(StepInputs(ids, torch.arange(n), torch.arange(n), attention, torch.tensor([n - 1])), pool)
        )
    # Another kernel for every projection, 30 layers deep: the logits agree to a tolerance (in the
    # bf16 logits' last places), and the model's choice is the same.
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0.05 * outs[1].abs().max().item())
    assert torch.equal(outs[0].argmax(-1), outs[1].argmax(-1))
