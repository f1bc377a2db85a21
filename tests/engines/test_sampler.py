import torch

from egrm.engines.embedded import sampler
from egrm.engines.embedded.sampler import sample


def _logits(probs: list[float]) -> torch.Tensor:
    return torch.tensor(probs).log()


def test_temperature_zero_is_greedy_whatever_the_uniform():
    logits = torch.randn(3, 50)
    tokens = sample(logits, torch.zeros(3), torch.ones(3), torch.tensor([0.0, 0.5, 0.999]))
    assert tokens.tolist() == logits.argmax(-1).tolist()


def test_rows_follow_their_own_parameters():
    logits = _logits([0.5, 0.3, 0.2]).repeat(2, 1)
    # Same uniform, row 0 greedy, row 1 hot with the full nucleus: the uniform picks the 3rd token.
    tokens = sample(logits, torch.tensor([0.0, 1.0]), torch.tensor([1.0, 1.0]), torch.tensor([0.95, 0.95]))
    assert tokens.tolist() == [0, 2]


def test_top_p_cuts_the_tail():
    logits = _logits([0.5, 0.3, 0.2]).unsqueeze(0)
    # top_p 0.7: the nucleus is {0, 1} (mass before token 2 is 0.8 >= 0.7); no uniform reaches 2.
    picks = {sample(logits, torch.ones(1), torch.tensor([0.7]), torch.tensor([u])).item() for u in (0.0, 0.6, 0.99)}
    assert picks == {0, 1}


def test_inverse_cdf_matches_the_distribution_exactly():
    probs = [0.4, 0.3, 0.2, 0.1]
    n = 1000
    uniforms = (torch.arange(n) + 0.5) / n  # evenly spaced quantiles
    logits = _logits(probs).repeat(n, 1)
    tokens = sample(logits, torch.ones(n), torch.ones(n), uniforms)
    counts = torch.bincount(tokens, minlength=4).tolist()
    assert counts == [400, 300, 200, 100]


def test_temperature_flattens():
    logits = _logits([0.9, 0.1]).repeat(2, 1)
    u = torch.tensor([0.85, 0.85])
    # At T=1 the 0.85 quantile is token 0; at T=4 the distribution is ~[0.64, 0.36] and it is token 1.
    assert sample(logits, torch.tensor([1.0, 4.0]), torch.ones(2), u).tolist() == [0, 1]


def test_flat_distribution_falls_back_to_the_full_vocabulary(monkeypatch):
    monkeypatch.setattr(sampler, "_TOP_KS", (4, 16))
    logits = torch.zeros(1, 100)  # uniform over 100 tokens: top-4 holds 4%, top-16 16% < top_p
    token = sample(logits, torch.ones(1), torch.ones(1), torch.tensor([0.995])).item()
    assert token not in logits.topk(16).indices.tolist()[0]


def test_a_row_draws_the_same_whatever_rows_are_beside_it(monkeypatch):
    """Only the rows whose nucleus reaches past the top-K search wider; a peaked row draws from
    its top-K alone whether or not a flat row shares its batch (before, every row then searched
    the whole vocabulary)."""
    monkeypatch.setattr(sampler, "_TOP_KS", (4, 16))
    gen = torch.Generator().manual_seed(0)
    peaked = torch.full((100,), -20.0)
    peaked[[3, 50, 71]] = torch.tensor([2.0, 1.0, 0.5])  # its nucleus: three tokens
    flat = torch.zeros(100)  # its nucleus: 95 tokens, found only in the whole vocabulary
    uniforms = torch.rand(64, generator=gen)
    alone = [sample(peaked[None], torch.ones(1), torch.tensor([0.95]), u[None]).item() for u in uniforms]
    together = [
        sample(torch.stack([flat, peaked]), torch.ones(2), torch.full((2,), 0.95), torch.stack([u, u]))
        for u in uniforms
    ]
    assert [t[1].item() for t in together] == alone
    assert set(alone) <= {3, 50, 71} and len(set(alone)) > 1
    # The flat row beside it still draws from its whole nucleus (95 of 100 tokens).
    assert len({t[0].item() for t in together}) > 16


def test_masked_tokens_are_never_drawn():
    logits = torch.zeros(1, 10)
    logits[0, :8] = float("-inf")
    for u in (0.0, 0.3, 0.7, 0.999):
        assert sample(logits, torch.ones(1), torch.ones(1), torch.tensor([u])).item() in (8, 9)


def test_the_log_normaliser_equals_logsumexp_over_a_wide_range():
    """It clamps terms below e^-87 (torch's exp is ~30x slower past them): the same float32 sums."""
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(8, 49152, generator=gen) * 20  # divided by a temperature: spans hundreds
    logits[0, :100] = float("-inf")  # a constrained row's masked tokens
    torch.testing.assert_close(
        sampler.log_normaliser(logits), torch.logsumexp(logits, -1, keepdim=True), rtol=0, atol=0
    )
    # With a temperature, scaled after the shift (no scaled copy of the vocabulary): float32 rounding.
    scale = torch.tensor([1 / 0.6, 1 / 0.7, 1 / 0.8, 1 / 0.9, 1.0, 2.0, 10.0, 1e5])[:, None]
    expected = torch.logsumexp(logits * scale, -1, keepdim=True)
    torch.testing.assert_close(sampler.log_normaliser(logits, scale), expected, rtol=1e-6, atol=0)


def test_a_row_sure_of_its_best_token_draws_it_without_a_search(monkeypatch):
    """A row whose best token holds top_p of the mass at T=1 draws it at any temperature up to 1
    (its share only grows as T falls): no top-K search, no tempered normaliser for it. A row at a
    temperature above 1, or one less sure, is searched as before."""
    searched: list[int] = []
    search = sampler._nucleus_pick

    def spy(logits, *rest):
        searched.append(logits.shape[0])
        return search(logits, *rest)

    monkeypatch.setattr(sampler, "_nucleus_pick", spy)
    sure, unsure = _logits([0.97, 0.02, 0.01]), _logits([0.5, 0.3, 0.2])
    logits = torch.stack([sure, sure, sure, unsure])
    temperatures = torch.tensor([0.6, 1.0, 1.5, 1.0])
    drawn = [sample(logits, temperatures, torch.full((4,), 0.95), torch.full((4,), u)).tolist() for u in (0.0, 0.99)]
    assert [d[:2] for d in drawn] == [[0, 0], [0, 0]]
    # At T=1.5 the sure row is ~[0.89, 0.07, 0.04]: its nucleus is {0, 1}, and the 0.99 quantile is 1.
    assert [d[2] for d in drawn] == [0, 1]
    assert [d[3] for d in drawn] == [0, 2]
    assert searched == [2, 2]  # the row at T=1.5 and the unsure one, once per draw
