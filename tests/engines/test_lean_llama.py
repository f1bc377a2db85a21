"""The lean forward's fast paths compute what the plain ones do: prepacked weights, decode attention."""

import pytest
import torch
import torch.nn.functional as F

from app.engines.embedded.lean_llama import LeanLlama
from app.engines.embedded.loader import load_model
from app.engines.embedded.prepacked import Linear, prepack_supported


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
    if dtype is torch.bfloat16:
        assert torch.equal(linear(x), expected)  # the same kernel, only the layout reordered once
    else:
        torch.testing.assert_close(linear(x), expected, rtol=1e-5, atol=1e-4)
    assert not Linear(weight, prepack=False).prepacked
    assert torch.equal(Linear(weight, prepack=False)(x), expected)


@pytest.mark.parametrize("rows, queries", [(5, 1), (1, 5), (2, 7)])
def test_decode_attention_equals_sdpa_with_the_same_mask(rows, queries):
    gen = torch.Generator().manual_seed(queries)
    heads, kv_heads, slots, hd = 9, 3, 40, 64
    q = torch.randn(rows, heads, queries, hd, generator=gen)
    # Slices of a larger cache, as the forward passes them (not contiguous).
    keys = torch.randn(rows, kv_heads, slots + 8, hd, generator=gen)[:, :, :slots]
    values = torch.randn(rows, kv_heads, slots + 8, hd, generator=gen)[:, :, :slots]
    mask = torch.rand(rows, 1, queries, slots, generator=gen) < 0.6
    mask[..., 0] = True  # every query sees at least one slot, as in the engine
    expected = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
    bias = LeanLlama.decode_bias(mask, kv_heads, heads // kv_heads)
    assert bias is not None  # the matmul path, not SDPA itself
    torch.testing.assert_close(LeanLlama._attend(q, keys, values, mask, bias), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_prepacked_forward_gives_the_same_logits(model_path):
    loaded = load_model(model_path, dtype="bfloat16")
    fast, plain = LeanLlama(loaded.model), LeanLlama(loaded.model, prepack=False)
    ids = torch.tensor([loaded.tokenizer.encode("The judge reads the answer and")])
    n = ids.shape[1]
    outs = []
    for lean in (fast, plain):
        cache = lean.new_cache(1, n + 1)
        mask = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
        args = (torch.arange(n)[None], torch.arange(n)[None], mask, cache, torch.tensor([n - 1]))
        outs.append(lean.forward(ids, *args))
    assert torch.equal(outs[0], outs[1])
