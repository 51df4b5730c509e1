"""Mixed precision on the CPU: the forward pass under autocast, float16's loss scale, and the
float32 master parameters and gradients every exchange sends."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ember.algorithms import FlatModel
from ember.worker.device import forward_precision, loss_scaler

CPU = torch.device("cpu")


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(512, 8, generator=generator)
    return x, (x[:, 0] + x[:, 1] > 0).long()  # two separable classes


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_a_mixed_precision_forward_pass_runs_in_its_dtype(precision) -> None:
    model = nn.Linear(8, 2)
    with forward_precision(precision, CPU):
        out = model(torch.randn(4, 8))
    assert out.dtype == (torch.bfloat16 if precision == "bf16-mixed" else torch.float16)
    assert model.weight.dtype == torch.float32
    assert loss_scaler("bf16-mixed", model, CPU) is None and loss_scaler("32", model, CPU) is None


def test_16_mixed_trains_a_tiny_model_with_float32_parameters_and_gradients() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    flat = FlatModel(model)
    scaler = loss_scaler("16-mixed", model, CPU)
    assert scaler is not None
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    x, y = _data()
    losses = []
    for step in range(60):
        rows = slice(step % 8 * 64, step % 8 * 64 + 64)
        flat.zero_grad()
        with forward_precision("16-mixed", CPU):
            outputs = model(x[rows])
        loss = F.cross_entropy(outputs.float(), y[rows])
        scaler.backward(loss)
        scaler.unscale()
        assert flat.grads.dtype == torch.float32 and torch.isfinite(flat.grads).all()
        optimizer.step()
        losses.append(loss.item())
    assert flat.params.dtype == torch.float32
    assert sum(losses[-8:]) / 8 < 0.3 < losses[0]
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    assert accuracy > 0.9


def test_an_overflowed_step_gives_zero_gradients_and_halves_the_scale() -> None:
    model = nn.Linear(8, 2)
    flat = FlatModel(model)
    scaler = loss_scaler("16-mixed", model, CPU)
    assert scaler is not None
    scale = scaler.scaler.get_scale()
    flat.zero_grad()
    scaler.backward(model(torch.full((1, 8), math.inf)).sum())
    scaler.unscale()
    assert scaler.overflows == 1
    assert torch.equal(flat.grads, torch.zeros_like(flat.grads))
    assert scaler.scaler.get_scale() == scale / 2
