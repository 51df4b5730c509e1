"""`single`: plain local SGD with no server, the single-machine baseline."""

from __future__ import annotations

from ember.algorithms.base import CommStats, Optimizer, WorkerContext
from ember.algorithms.flat import FlatModel


class LocalSGD:
    def __init__(self, context: WorkerContext) -> None:
        self.context = context
        self.stats = CommStats()
        self.optimizer: Optimizer | None = None

    def start(self, flat: FlatModel, optimizer: Optimizer | None) -> int:
        self.optimizer = optimizer
        return 0

    def after_backward(self, step: int) -> None:
        assert self.optimizer is not None
        self.optimizer.step()

    def finish(self) -> None:
        pass
