"""Prediction: what the throughput model says of one strategy at one worker count and tau."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Prediction:
    strategy: str
    workers: int
    servers: int
    tau: float  # a mean, for a run whose tau moved
    samples_per_second: float
    period: float  # seconds per worker period of tau steps
    t_comm: float  # seconds per exchange
    bound: str  # what sets the period: worker, server, cpu or network
    compute: float = 0.0  # seconds of the worker's own computing per period
    bounds: Mapping[str, float] = field(default_factory=dict)  # every candidate period
    fragments: int = 1  # diloco's --fragments: synced a fragment at a time, overlapped

    @property
    def compute_bound(self) -> bool:
        """The worker's computing sets the period: no exchange, link or server holds it up."""
        return self.period <= self.compute * (1 + 1e-9)
