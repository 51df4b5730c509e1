"""ClockTable: which workers a server waits for, at what clock, and who is alive.

The table holds the run's own workers (ids below `expected`) for good: a resumed run needs
each one's step, and that a finished one stays gone. A worker that joined later (`ember join`)
is forgotten when it finishes, or some timeouts after it fell silent, and registrations past
`max_workers` are refused, so no run, however long, grows the table without bound.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ember.errors import ConfigError, ProtocolError
from ember.ps.clockrows import MAX_ID, MAX_TABLE_ROWS, check_rows, pack_rows, rows_to_table

NO_LIVE_WORKER = 1 << 62  # min_clock when nobody is live: every request is ready
# How far past a worker's newest request a sequence number may be. A client numbers its
# requests one by one and sends each to every shard, so a live worker is never more than a few
# ahead of what its shard saw (a backup's copy lags by an interval's worth of requests); a
# million ahead is a forged or corrupt number, which would otherwise make every later request
# of the worker look like a duplicate, acknowledged and never applied.
SEQ_WINDOW = 1 << 20
JOIN_HEADROOM = 1024  # joined workers a shard keeps besides a few times the run's own
# A joiner silent this many worker timeouts is forgotten: long enough to come back from a
# pause, short enough that crashed joiners do not fill the table.
DROPPED_RETENTION = 4


def default_max_workers(expected: int) -> int:
    return 4 * expected + JOIN_HEADROOM


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
    speak again. Only entries that are not live are ever forgotten, so min_clock, and with it
    BSP and SSP, never sees the difference."""

    def __init__(
        self,
        expected: int,
        saved: dict[int, dict[str, int]] | None,
        timeout: float,
        startup_grace: float,
        max_workers: int | None = None,
        members_max: int | None = None,
    ) -> None:
        self.expected, self.timeout, self.startup_grace = expected, timeout, startup_grace
        self.members_max = members_max  # a worker range's MAX: live members at most
        self.joins = self.leaves = 0  # joiners registered; members that left or fell silent
        self.max_workers = default_max_workers(expected) if max_workers is None else max_workers
        if not expected <= self.max_workers <= MAX_TABLE_ROWS:
            raise ConfigError(
                f"max_workers must be between the run's {expected} workers and "
                f"{MAX_TABLE_ROWS}, got {self.max_workers}"
            )
        self.entries = {w: WorkerEntry(-1) for w in range(expected)}
        for key, values in (saved or {}).items():
            worker = int(key)
            finished = bool(values.get("finished", False))  # a worker that left stays gone
            joiner = worker >= expected
            if joiner and (finished or len(self.entries) >= self.max_workers):
                continue  # it never comes back (a joiner starts under a new id), or no room
            # A joiner saved live may come back (its server restarted): nobody waits for it,
            # and if it registers again it goes on from its clock and step.
            self.entries[worker] = WorkerEntry(
                -1,
                clock=values["clock"],
                step=values["step"],
                live=not (finished or joiner),
                finished=finished,
            )
        self.events: deque[dict[str, Any]] = deque(maxlen=200)

    @property
    def retention(self) -> float:
        """Seconds a silent joiner's entry is kept for it to come back."""
        return DROPPED_RETENTION * self.timeout

    def min_clock(self) -> int:
        live = [e.clock for e in self.entries.values() if e.live]
        return min(live) if live else NO_LIVE_WORKER

    def run_step(self) -> int:
        """Where the run's schedule stands: the furthest step the run's own workers (not the
        joiners, whose steps count their own rows) have pushed; a joiner's schedule starts
        there, as hivemind's load_state_from_peers gives a newcomer its peers' epoch."""
        own = [e.step for w, e in self.entries.items() if w < self.expected and e.incarnation >= 0]
        return max(own, default=0)

    def register(self, worker: int, incarnation: int, server_step: int) -> WorkerEntry:
        if not (0 <= worker < MAX_ID and 0 <= incarnation < MAX_ID):
            raise ProtocolError(
                f"worker {worker} incarnation {incarnation}: both must be in [0, {MAX_ID})"
            )
        old = self.entries.get(worker)
        if old is not None and incarnation == old.incarnation and not old.finished:
            # the same process again, after its server failed over or restarted: it goes on
            return self.known(worker, incarnation)
        if old is not None and incarnation <= old.incarnation:
            raise ProtocolError(
                f"worker {worker} incarnation {incarnation} is not newer than {old.incarnation}"
            )
        if old is None:
            self._admit(worker)
            self._make_room(worker)
            self.joins += worker >= self.expected
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

    def _admit(self, worker: int) -> None:
        """Refuse a newcomer while a worker range's MAX members are live."""
        live = sum(e.live for e in self.entries.values())
        if self.members_max is not None and worker >= self.expected and live >= self.members_max:
            raise ProtocolError(
                f"worker {worker}: the run's worker range is full, {live} of its at most"
                f" {self.members_max} members are in; join when one has left"
            )

    def _make_room(self, worker: int) -> None:
        """Before a new id enters a full table, forget the joiner silent the longest; with
        every joiner live, refuse it."""
        if len(self.entries) < self.max_workers:
            return
        gone = [(e.last_seen, w) for w, e in self.entries.items() if self._forgettable(w, e)]
        if gone:
            del self.entries[min(gone)[1]]
            return
        live = sum(e.live for e in self.entries.values())
        raise ProtocolError(
            f"worker {worker} cannot register: this shard already holds max_workers="
            f"{self.max_workers} workers ({self.expected} of the run, {live} live), the most "
            f"it keeps; a joined worker leaves the table when it finishes, or "
            f"{self.retention:g}s after it falls silent: let joined workers finish before more "
            "join, or start the run with more --workers"
        )

    def _forgettable(self, worker: int, entry: WorkerEntry) -> bool:
        return worker >= self.expected and not entry.live

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

    def finish(self, worker: int) -> None:
        """The worker said `done`: one of the run's own stays, finished, so a resumed run
        leaves it out; a joiner is forgotten (a joiner never resumes under its old id)."""
        entry = self.entries[worker]
        entry.live, entry.finished = False, True  # requests of it still held are void
        if worker >= self.expected:
            del self.entries[worker]
            self.leaves += 1

    def drop_silent(self, waiting: set[int]) -> list[int]:
        """Drop live workers silent for longer than the timeout (a worker whose request the
        server holds is waiting on us, not silent), and forget joiners silent for longer than
        the retention. Returns the dropped worker ids."""
        now, dropped, forgotten = time.monotonic(), [], []
        for worker, entry in self.entries.items():
            silent = now - entry.last_seen
            if not entry.live:
                if self._forgettable(worker, entry) and silent > self.retention:
                    forgotten.append(worker)
                continue
            limit = self.startup_grace if entry.incarnation < 0 else self.timeout
            if id(entry) not in waiting and silent > limit:
                entry.live = False
                dropped.append(worker)
                self.leaves += entry.incarnation >= 0  # one that never came did not leave
                self.events.append(
                    {"event": "drop", "worker": worker, "silent_seconds": round(silent, 1)}
                )
        for worker in forgotten:
            del self.entries[worker]
        return dropped

    def touch_all(self) -> None:
        now = time.monotonic()
        for entry in self.entries.values():
            entry.last_seen = now

    def summary(self) -> dict[str, int]:
        """Counts of the table's entries: a bounded answer whatever its size."""
        entries = self.entries.values()
        return {
            "table": len(self.entries),
            "max_workers": self.max_workers,
            "expected": self.expected,
            "registered": sum(e.incarnation >= 0 for e in entries),
            "live": sum(e.live for e in entries),
            "finished": sum(e.finished for e in entries),
            "dropped": sum(not (e.live or e.finished) for e in entries),
            "members": sum(e.live and e.incarnation >= 0 for e in entries),  # in, now
            "joins": self.joins,
            "leaves": self.leaves,
        }

    def live_sample(self, size: int = 32) -> list[int]:
        """The lowest ids of live workers, at most `size` of them."""
        return heapq.nsmallest(size, (w for w, e in self.entries.items() if e.live))

    def rows(self, resume_only: bool = False) -> np.ndarray:
        """The table as int64 rows of COLUMNS, to travel in a payload frame. `resume_only`
        keeps what a checkpoint needs: the run's own workers, and joiners still live."""
        return pack_rows(
            (w, e.incarnation, e.clock, e.step, e.answered_seq, e.live, e.finished)
            for w, e in self.entries.items()
            if not resume_only or w < self.expected or e.live
        )

    def table(self) -> dict[str, dict[str, int]]:
        """What a checkpoint keeps (see `rows`), keyed by worker id."""
        return rows_to_table(self.rows(resume_only=True))

    def restore(self, rows: object) -> None:
        """Replace the table with a copy's `rows`; every row is checked before any is used."""
        checked = check_rows(rows, self.max_workers)
        now, entries = time.monotonic(), {}
        for worker, incarnation, clock, step, seq, live, finished in checked.tolist():
            entries[worker] = WorkerEntry(
                incarnation,
                clock=clock,
                step=step,
                last_seq=seq,
                answered_seq=seq,
                last_seen=now,
                live=bool(live),
                finished=bool(finished),
            )
        self.entries = entries
