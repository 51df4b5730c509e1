"""ClockTable: which workers a server waits for, at what clock, and who is alive."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ember.errors import ProtocolError

NO_LIVE_WORKER = 1 << 62  # min_clock when nobody is live: every request is ready
# How far past a worker's newest request a sequence number may be. A client numbers its
# requests one by one and sends each to every shard, so a live worker is never more than a few
# ahead of what its shard saw (a backup's copy lags by an interval's worth of requests); a
# million ahead is a forged or corrupt number, which would otherwise make every later request
# of the worker look like a duplicate, acknowledged and never applied.
SEQ_WINDOW = 1 << 20


@dataclass
class WorkerEntry:
    incarnation: int  # -1: expected but not registered yet
    clock: int = 0  # pushes folded so far
    step: int = 0  # the worker's own step at its last folded push (its resume point)
    last_seq: int = -1  # newest request seen
    answered_seq: int = -1  # newest request fully served (what a replica may count as done)
    last_seen: float = field(default_factory=time.monotonic)
    live: bool = True  # counts towards min_clock
    finished: bool = False  # said `done`; never revived
    pulled_at: int = 0  # server updates at this worker's last read, for staleness

    def check_seq(self, worker: int, seq: int) -> None:
        """Refuse a sequence number too far past this incarnation's newest (see SEQ_WINDOW)."""
        if seq > self.last_seq + SEQ_WINDOW:
            raise ProtocolError(
                f"worker {worker} sequence number {seq} is more than {SEQ_WINDOW} past "
                f"its last, {self.last_seq}"
            )


class ClockTable:
    """Per-worker clocks of one shard. Workers the run expects count before they register, so
    an early starter cannot complete a BSP round alone; silent workers are dropped after a
    timeout so nobody waits for them forever, and come back level with the slowest if they
    speak again."""

    def __init__(
        self,
        expected: int,
        saved: dict[int, dict[str, int]] | None,
        timeout: float,
        startup_grace: float,
    ) -> None:
        self.timeout, self.startup_grace = timeout, startup_grace
        self.entries = {w: WorkerEntry(-1) for w in range(expected)}
        for worker, values in (saved or {}).items():
            finished = bool(values.get("finished", False))  # a worker that left stays gone
            self.entries[int(worker)] = WorkerEntry(
                -1, clock=values["clock"], step=values["step"], live=not finished, finished=finished
            )
        self.events: deque[dict[str, Any]] = deque(maxlen=200)

    def min_clock(self) -> int:
        live = [e.clock for e in self.entries.values() if e.live]
        return min(live) if live else NO_LIVE_WORKER

    def register(self, worker: int, incarnation: int, server_step: int) -> WorkerEntry:
        old = self.entries.get(worker)
        if old is not None and incarnation == old.incarnation and not old.finished:
            # the same process again, after its server failed over or restarted: it goes on
            return self.known(worker, incarnation)
        if old is not None and incarnation <= old.incarnation:
            raise ProtocolError(
                f"worker {worker} incarnation {incarnation} is not newer than {old.incarnation}"
            )
        others = [e.clock for w, e in self.entries.items() if e.live and w != worker]
        if old is None:  # a newcomer starts level with the slowest live worker
            clock, step = (min(others) if others else 0), 0
        elif old.live:  # a restart (or the first start) keeps the progress it had
            clock, step = old.clock, old.step
        else:  # a dropped worker cannot reopen rounds the others have closed without it
            clock, step = max(old.clock, min(others, default=old.clock)), old.step
        if old is not None:
            old.live = False  # voids whatever the old incarnation left held at the server
        entry = WorkerEntry(incarnation, clock=clock, step=step, pulled_at=server_step)
        self.entries[worker] = entry
        self.events.append(
            {
                "event": "register",
                "worker": worker,
                "incarnation": incarnation,
                "clock": clock,
                "step": step,
            }
        )
        return entry

    def known(self, worker: int, incarnation: int) -> WorkerEntry:
        """The entry a request speaks for; a dropped worker that speaks again is revived."""
        entry = self.entries.get(worker)
        if entry is None or entry.incarnation != incarnation:
            raise ProtocolError(f"worker {worker} incarnation {incarnation} is not registered")
        if entry.finished:
            raise ProtocolError(f"worker {worker} already finished; register again")
        if not entry.live:
            others = [e.clock for e in self.entries.values() if e.live]
            entry.clock = max(entry.clock, min(others, default=entry.clock))
            entry.live = True
            self.events.append({"event": "rejoin", "worker": worker, "clock": entry.clock})
        entry.last_seen = time.monotonic()
        return entry

    def finish(self, entry: WorkerEntry) -> None:
        entry.live, entry.finished = False, True

    def drop_silent(self, waiting: set[int]) -> list[int]:
        """Drop live workers silent for longer than the timeout (a worker whose request the
        server holds is waiting on us, not silent). Returns the dropped worker ids."""
        now, dropped = time.monotonic(), []
        for worker, entry in self.entries.items():
            limit = self.startup_grace if entry.incarnation < 0 else self.timeout
            if entry.live and id(entry) not in waiting and now - entry.last_seen > limit:
                entry.live = False
                dropped.append(worker)
                self.events.append(
                    {
                        "event": "drop",
                        "worker": worker,
                        "silent_seconds": round(now - entry.last_seen, 1),
                    }
                )
        return dropped

    def table(self) -> dict[str, dict[str, int]]:
        return {
            str(w): {
                "clock": e.clock,
                "step": e.step,
                "finished": e.finished,
                "incarnation": e.incarnation,  # -1 until the worker registers
            }
            for w, e in self.entries.items()
        }

    def touch_all(self) -> None:
        now = time.monotonic()
        for entry in self.entries.values():
            entry.last_seen = now

    def replica_table(self) -> dict[str, list[int]]:
        """Everything a backup needs to take over: a request the primary answered is never
        applied twice, one it had not answered is applied when the worker sends it again."""
        return {
            str(w): [e.incarnation, e.clock, e.step, e.answered_seq, e.live, e.finished]
            for w, e in self.entries.items()
        }

    def restore(self, table: object) -> None:
        """Replace the table with a replica_table's; every entry is checked before any is used."""
        if not isinstance(table, dict):
            raise ProtocolError(f"workers must be a map of worker to entry, got {table!r}")
        now, entries = time.monotonic(), {}
        for worker, values in table.items():
            worker_id = _worker_id(worker)
            incarnation, clock, step, seq, live, finished = _replica_entry(worker, values)
            entries[worker_id] = WorkerEntry(
                incarnation,
                clock=clock,
                step=step,
                last_seq=seq,
                answered_seq=seq,
                last_seen=now,
                live=live,
                finished=finished,
            )
        self.entries = entries


def _worker_id(worker: object) -> int:
    if not (isinstance(worker, str) and worker.isdecimal() and worker.isascii()):
        raise ProtocolError(f"workers: worker id must be a decimal string, got {worker!r}")
    return int(worker)


def _replica_entry(worker: str, values: object) -> tuple[int, int, int, int, bool, bool]:
    """[incarnation, clock, step, answered_seq, live, finished], as replica_table writes it."""
    fields = ("incarnation", "clock", "step", "seq", "live", "finished")
    if not isinstance(values, list) or len(values) != len(fields):
        raise ProtocolError(f"workers[{worker!r}] must be a list of {list(fields)}, got {values!r}")
    for name, value, kind in zip(fields, values, (int, int, int, int, bool, bool), strict=True):
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            kind_name = kind.__name__
            raise ProtocolError(f"workers[{worker!r}].{name} must be {kind_name}, got {value!r}")
    incarnation, clock, step, seq, live, finished = values
    return incarnation, clock, step, seq, live, finished
