"""The one protocol an engine's workers speak to the Run that watches them (start, poll,
restart, stop), in the shape of torch.distributed.elastic's agent: the engine knows how its
workers start and how they are seen to end; the Run's watch loop decides what happens next."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from ember.metrics.records import Record


@dataclass(frozen=True)
class Exit:
    """A worker that ended without finishing its training."""

    rank: int
    exitcode: int | None  # None: it raised, and said so in a record
    error: str  # the worker's own words, a traceback; may be empty
    final: bool = False  # a restart could only repeat it (its data, model or code)


@dataclass
class Polled:
    """What one poll of the workers saw."""

    records: list[Record] = field(default_factory=list)  # to metrics.jsonl and the bar
    shown: list[Record] = field(default_factory=list)  # to the bar alone
    exits: list[Exit] = field(default_factory=list)
    notes: list[tuple[Record, str]] = field(default_factory=list)  # what happened to the run


class Workers(Protocol):
    """An engine's workers as its Run drives them. `restarts_ranks`: the Run restarts a rank
    that died (the local engine); otherwise the engine's scheduler retries its tasks itself
    (Spark's stage attempts) and an Exit it reports is the end."""

    restarts_ranks: bool

    def start(self) -> None:
        """Launch every worker."""

    def running(self) -> bool:
        """Whether a worker is yet to finish (or what finished is yet to be polled)."""

    def poll(self, timeout: float) -> Polled:
        """What happened within `timeout` seconds: records, exits, the engine's own notes."""

    def restart(self, rank: int, incarnation: int) -> None:
        """Launch rank `rank` again as its `incarnation`-th incarnation."""

    def failure(self, exit: Exit, why: str) -> tuple[Record, str]:
        """The record for metrics.jsonl and the message that end the run on `exit`."""

    def pids(self) -> list[int | None]:
        """The engine's processes on this machine whose memory is the run's."""

    def stop(self) -> None:
        """End every worker still running; safe to call more than once."""


__all__ = ["Exit", "Polled", "Workers"]
