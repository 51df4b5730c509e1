"""`single`: plain local SGD with no server, the single-machine baseline."""

from __future__ import annotations

import torch

from ember.algorithms.base import CommStats, WorkerContext
from ember.algorithms.flat import FlatModel


class LocalSGD:
    def __init__(self, context: WorkerContext) -> None:
        self.context = context
        self.stats = CommStats()
        self.optimizer: torch.optim.Optimizer | None = None

    def start(self, flat: FlatModel, optimizer: torch.optim.Optimizer | None) -> int:
        self.optimizer = optimizer
        return 0

    def after_backward(self, step: int) -> None:
        assert self.optimizer is not None
        self.optimizer.step()

    def finish(self) -> None:
        pass
