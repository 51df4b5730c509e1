"""Consistency policies: when the server may answer a worker (pure and stateless; leaf module)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ember.errors import ConfigError


class Consistency(Protocol):
    """Decides readiness from two clocks only, so it can be tested exhaustively on its own."""

    @property
    def name(self) -> str: ...

    @property
    def synchronous(self) -> bool:
        """True: the server sums a round's contributions and commits them together."""
        ...

    def ready(self, worker_clock: int, min_clock: int) -> bool:
        """May a worker at `worker_clock` be served while the slowest is at `min_clock`?"""
        ...


@dataclass(frozen=True)
class StaleSynchronous:
    """SSP(s): a worker at clock c waits while c - min_clock > s. BSP is SSP(0)."""

    staleness: int
    name: str = "ssp"
    synchronous: bool = False

    def ready(self, worker_clock: int, min_clock: int) -> bool:
        return worker_clock - min_clock <= self.staleness


@dataclass(frozen=True)
class BulkSynchronous(StaleSynchronous):
    """BSP: every request waits for the round it depends on; contributions commit per round."""

    staleness: int = 0
    name: str = "bsp"
    synchronous: bool = True


@dataclass(frozen=True)
class Asynchronous:
    """Async: never waits (Downpour, DeepSpark)."""

    name: str = "async"
    synchronous: bool = False

    def ready(self, worker_clock: int, min_clock: int) -> bool:
        return True


def make_consistency(name: str, staleness: int = 0) -> Consistency:
    if name == "bsp":
        return BulkSynchronous()
    if name == "ssp":
        if staleness < 0:
            raise ConfigError(f"staleness must be >= 0, got {staleness}")
        return StaleSynchronous(staleness)
    if name == "async":
        return Asynchronous()
    raise ConfigError(f"consistency must be one of bsp, ssp, async; got {name!r}")
