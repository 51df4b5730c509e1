"""What every worker-side algorithm shares: its context, its counters and its protocol."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ember.algorithms.flat import FlatModel
from ember.config import RunConfig
from ember.ps import ExchangeResult


@dataclass
class WorkerContext:
    """Where a worker stands in the run: handed to its algorithm by the worker loop."""

    config: RunConfig
    rank: int
    world: int
    servers: list[str] = field(default_factory=list)  # parameter-server addresses
    secret: bytes = b""  # the run's secret, proven to the servers
    incarnation: int = 0  # bumped each time this rank is restarted
    rendezvous: str = ""  # torch.distributed init_method for allreduce
    store: Any = None  # or the torch.distributed Store the engine met in (Spark's tasks)


@dataclass
class CommStats:
    t_comm: float = 0.0  # seconds spent in exchanges (round trips with servers or peers)
    t_wait: float = 0.0  # of which compute was blocked waiting
    bytes_pushed: int = 0
    bytes_pulled: int = 0
    exchanges: int = 0
    staleness_sum: int = 0
    staleness_max: int = 0

    def record(self, result: ExchangeResult, blocked: float) -> None:
        self.t_comm += result.seconds
        self.t_wait += blocked
        self.bytes_pushed += result.bytes_pushed
        self.bytes_pulled += result.bytes_pulled
        self.exchanges += 1
        self.staleness_sum += result.staleness
        self.staleness_max = max(self.staleness_max, result.staleness)

    def as_record(self) -> dict[str, float | int]:
        return {
            "t_comm": self.t_comm,
            "t_wait": self.t_wait,
            "bytes_pushed": self.bytes_pushed,
            "bytes_pulled": self.bytes_pulled,
            "exchanges": self.exchanges,
            "staleness_max": self.staleness_max,
            "staleness_mean": self.staleness_sum / max(1, self.exchanges),
        }


class Algorithm(Protocol):
    """The part of a training step that differs per strategy; the loop around it does not."""

    stats: CommStats

    def start(self, flat: FlatModel, optimizer: torch.optim.Optimizer | None) -> int:
        """Connect and load the starting parameters; return the local step to resume from."""
        ...

    def after_backward(self, step: int) -> None:
        """Gradients of step `step` are in flat.grads: update the parameters."""
        ...

    def finish(self) -> None:
        """Apply anything in flight, leave the servers or process group, release sockets."""
        ...


def local_optimizer(flat: FlatModel, config: RunConfig) -> torch.optim.Optimizer:
    return torch.optim.SGD(
        flat.module.parameters(), lr=config.lr, momentum=config.momentum, nesterov=config.nesterov
    )
