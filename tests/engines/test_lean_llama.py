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


@pytest.mark.parametrize("rows, queries", [(5, 1), (1, 5), (2, 7)])
def test_padded_attention_equals_sdpa_row_by_row(rows, queries):
    gen = torch.Generator().manual_seed(queries)
    heads, kv_heads, slots, hd = 9, 3, 40, 64
    kv = torch.randn(2, kv_heads, 4 * slots, hd, generator=gen)  # a pool's K and V; each row reads some slots
    q = torch.randn(rows * queries, heads, hd, generator=gen)  # flat, row after row
    row_slots = torch.stack([torch.randperm(4 * slots, generator=gen)[:slots] for _ in range(rows)])  # (S, U)
    mask = torch.rand(rows, queries, slots, generator=gen) < 0.6
    mask[..., 0] = True  # every query sees at least one slot, as in the engine
    padded = PaddedRows.build(
        torch.arange(rows * queries),
        row_slots.flatten(),
        mask,
        torch.arange(rows * queries),
        kv_heads,
        heads // kv_heads,
    )
    for s in range(rows):
        dense = DenseRow(s * queries, (s + 1) * queries, row_slots[s], mask[s][None, None])
        expected = dense.attend(q, kv)
        got = padded.attend(q, kv)[s * queries : (s + 1) * queries]
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_prepacked_forward_gives_the_same_logits(model_path):
    loaded = load_model(model_path, dtype="bfloat16")
    fast, plain = LeanLlama(loaded.model), LeanLlama(loaded.model, prepack=False)
    ids = torch.tensor(loaded.tokenizer.encode("The judge reads the answer and"))
    n = ids.shape[0]
    outs = []
    for lean in (fast, plain):
        pool = KVPool(len(lean.layers), lean.kv_heads, lean.head_dim, 1, 16, lean.dtype, lean.device)
        causal = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
        attention = [DenseRow(0, n, torch.arange(n), causal)]
        outs.append(
            lean.forward(StepInputs(ids, torch.arange(n), torch.arange(n), attention, torch.tensor([n - 1])), pool)
        )
    # Another kernel for every projection, 30 layers deep: the logits agree to a tolerance (in the
    # bf16 logits' last places), and the model's choice is the same.
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0.05 * outs[1].abs().max().item())
    assert torch.equal(outs[0].argmax(-1), outs[1].argmax(-1))
