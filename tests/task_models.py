"""Models and data of tasks that are not ember's classifier: a regression, a per-token
sequence task on int64 token ids, and a CNN with BatchNorm. Workers unpickle the module
objects and import the functions from here, so they live in a module, not in a test."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

VOCAB, LENGTH = 12, 8  # the sequence task's token ids and sequence length


def regression_data(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """y = a fixed nonlinear function of 8 float features, plus a little noise: (rows, 2)
    float targets, so the model has two outputs."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 8)).astype(np.float32)
    w = np.random.default_rng(99).normal(size=(8, 2)).astype(np.float32)
    y = np.tanh(x @ w) + 0.3 * x[:, :2] ** 2 + 0.05 * rng.normal(size=(rows, 2))
    return x, y.astype(np.float32)


def regression_net() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 2))


def reversal_data(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Token ids (rows, LENGTH) and, per token, the id at the mirrored position: every
    output token needs attention to another position."""
    tokens = np.random.default_rng(seed).integers(0, VOCAB, size=(rows, LENGTH))
    return tokens.astype(np.int64), tokens[:, ::-1].astype(np.int64).copy()


class TinyEncoder(nn.Module):
    """A Transformer encoder over token ids, logits per token: (batch, LENGTH, VOCAB)."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.position = nn.Parameter(torch.randn(LENGTH, width) * 0.1)
        layer = nn.TransformerEncoderLayer(
            width, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(width, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens) + self.position))


def bn_cnn(num_classes: int = 10) -> nn.Module:
    """A small CNN with BatchNorm2d for (1, 28, 28) images."""
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 7 * 7, num_classes),
    )


def per_token_accuracy(output: torch.Tensor, target: torch.Tensor) -> float:
    """A user's metric: the share of sequences with every token right."""
    return float((output.argmax(dim=-1) == target).all(dim=-1).float().mean())


def rmsprop(params: object) -> torch.optim.Optimizer:
    """A user's optimizer, built from the parameters as ember.fit(optimizer=...) calls it."""
    return torch.optim.RMSprop(params, lr=2e-3, alpha=0.95)  # type: ignore[arg-type]


def halve_every_100(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    """A user's schedule, built from the optimizer."""
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.5)
