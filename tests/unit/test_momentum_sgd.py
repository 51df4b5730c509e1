"""The workers' local optimizer against torch.optim.SGD, and what it spares their start."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ember.algorithms.base import MomentumSGD


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))


@pytest.mark.parametrize(
    ("momentum", "nesterov", "decay"), [(0.0, False, 0.0), (0.9, False, 0.0), (0.5, True, 0.0),
                                        (0.9, False, 0.01), (0.0, False, 0.01)]
)  # fmt: skip
def test_it_takes_torch_sgd_steps_exactly(momentum: float, nesterov: bool, decay: float) -> None:
    ours, theirs = _model(0), _model(0)
    mine = MomentumSGD(ours.parameters(), 0.1, momentum, nesterov, weight_decay=decay)
    reference = torch.optim.SGD(
        theirs.parameters(), lr=0.1, momentum=momentum, nesterov=nesterov, weight_decay=decay
    )
    generator = torch.Generator().manual_seed(1)
    for step in range(6):
        x = torch.randn(8, 5, generator=generator)
        for model in (ours, theirs):
            model.zero_grad(set_to_none=True)
            model(x).square().sum().backward()
            if step in (0, 2):  # left alone without a gradient; its buffer starts after the rest
                model[2].bias.grad = None
        mine.step()
        reference.step()
        for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
            assert torch.equal(a, b), f"step {step}"
    assert not torch.equal(ours[0].weight, _model(0)[0].weight)  # it did move


def test_a_worker_step_does_not_import_torch_dynamo() -> None:
    probe = (
        "import sys, torch\n"
        "from ember.algorithms import FlatModel, local_optimizer\n"
        "from ember.config import RunConfig\n"
        "flat = FlatModel(torch.nn.Linear(3, 2), flat_grads=False)\n"
        "optimizer = local_optimizer(flat.module, RunConfig(nesterov=True).validate())\n"
        "flat.module(torch.ones(1, 3)).sum().backward()\n"
        "optimizer.step()\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "False"
