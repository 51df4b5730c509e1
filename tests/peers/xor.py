"""Horovod's XOR model (test/integration/test_spark_torch.py) and its optimizer, in a module
of their own: the Spark tasks unpickle the model by this module's path (tests.peers.xor),
which a test module's own name is not."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class XOR(nn.Module):
    def __init__(self, input_dim: int = 2, output_dim: int = 1) -> None:
        super().__init__()
        self.lin1 = nn.Linear(input_dim, 8)
        self.lin2 = nn.Linear(8, output_dim)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.lin1(features.float()))
        return torch.sigmoid(self.lin2(x))


def sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1)
