"""The hybrid loss against hand-computed values and gradients."""

from __future__ import annotations

import pytest
import torch

from egrm.training.loss import HybridLoss


def _grad(loss: HybridLoss, q_hat: list[float], q: list[float], pairs: list[list[int]]) -> tuple[float, list[float]]:
    x = torch.tensor(q_hat, dtype=torch.float64, requires_grad=True)
    value = loss(x, torch.tensor(q, dtype=torch.float64), torch.tensor(pairs, dtype=torch.long).reshape(-1, 2))
    value.backward()
    assert x.grad is not None
    return value.item(), x.grad.tolist()


def test_pairs_already_apart_cost_only_the_regression() -> None:
    # Huber (delta 1, errors below it) = mean(0.5 e^2) = (0.005 + 0.02 + 0.125) / 3 = 0.05; gaps 0.7, 0.3 > margin.
    value, grad = _grad(HybridLoss(), [0.9, 0.2, 0.5], [1, 0, 1], [[0, 1], [2, 1]])
    assert value == pytest.approx(0.7 * 0.05)
    assert grad == pytest.approx([0.7 * -0.1 / 3, 0.7 * 0.2 / 3, 0.7 * -0.5 / 3])


def test_a_reversed_pair_pays_the_hinge() -> None:
    # Huber: (0.5*0.49 + 0.5*0.1225) / 2 = 0.153125; hinge: 0.1 - (0.3 - 0.35) = 0.15.
    value, grad = _grad(HybridLoss(), [0.3, 0.35], [1, 0], [[0, 1]])
    assert value == pytest.approx(0.7 * 0.153125 + 0.3 * 0.15)
    assert grad == pytest.approx([0.7 * -0.7 / 2 - 0.3, 0.7 * 0.35 / 2 + 0.3])


def test_huber_is_linear_past_delta() -> None:
    # delta 0.5, error 0.7: 0.5 * (0.7 - 0.25) = 0.225, gradient -delta; a = 1: no ranking term.
    value, grad = _grad(HybridLoss(a=1.0, delta=0.5), [0.3], [1.0], [])
    assert value == pytest.approx(0.225)
    assert grad == pytest.approx([-0.5])


def test_no_pairs_is_not_nan() -> None:
    value, _ = _grad(HybridLoss(), [0.5, 0.5], [1, 1], [])
    assert value == pytest.approx(0.7 * 0.125)


def test_only_ranking() -> None:
    value, grad = _grad(HybridLoss(a=0.0, margin=0.2), [0.5, 0.4, 0.9], [1, 0, 0], [[0, 1], [0, 2]])
    # gaps 0.1 and -0.4: hinges 0.1 and 0.6, mean 0.35
    assert value == pytest.approx(0.35)
    assert grad == pytest.approx([-1.0, 0.5, 0.5])


@pytest.mark.parametrize("kwargs", [{"a": 1.5}, {"a": -0.1}, {"delta": 0}, {"margin": -1}])
def test_bad_parameters(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        HybridLoss(**kwargs)
