"""The data cursor of a worker range's run: each epoch's rows cut into pieces (runs of batches,
the last taking the rows left over) and handed to members from a queue the servers keep, as
Spark hands out tasks. A member leases a piece, says it started it when it serves the rows,
and says it finished it when it asks for the next; a member that leaves gives back what it
had not started; one that died has its pieces handed out again, and the rows whose updates
the servers had folded count as trained twice: the holder's steps from the one it said it
started the piece at to its last the servers folded (`steps_of`, the clock table's record),
times the batch size it said; else the whole piece, an upper bound. Which rows a piece holds
is the worker's to compute from the run's seed (worker/pieces.py): only piece numbers cross
the wire (piece_protocol.py).

Bounded whatever a peer says: pieces per epoch and epochs are capped, one epoch opens only
once the one before has handed out every piece, and leases are one per piece.
"""

from __future__ import annotations

import base64
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAX_PIECES = 1 << 20  # pieces of one epoch
MAX_EPOCHS = 1 << 16
Key = tuple[int, int]  # (epoch, piece)


@dataclass(frozen=True)
class Geometry:
    """How a run's rows are cut: `rows` rows an epoch, `piece_rows` a piece, `epochs` epochs."""

    rows: int
    piece_rows: int
    epochs: int

    @property
    def pieces(self) -> int:
        return max(1, self.rows // self.piece_rows)

    def rows_of(self, piece: int) -> int:
        """The piece's rows: piece_rows, the last piece those left over too."""
        last = piece == self.pieces - 1
        return self.rows - piece * self.piece_rows if last else self.piece_rows


@dataclass
class Lease:
    worker: int
    incarnation: int
    started: bool = False  # its rows were served
    renewed: float = field(default_factory=time.monotonic)
    step: int | None = None  # the holder's own steps done when it started the piece
    batch: int = 0  # rows a step of the holder's: its batch size (0: not said)


@dataclass
class _Epoch:
    """One open epoch: pieces never handed out start at `fresh`; `returned` ones go first."""

    done: np.ndarray  # bool per piece
    fresh: int = 0
    returned: deque[int] = field(default_factory=deque)

    def pending(self) -> bool:
        return bool(self.returned) or self.fresh < len(self.done)


class PieceQueue:
    """The pieces of every epoch, who holds which, and what was trained."""

    def __init__(self, geometry: Geometry, lease_seconds: float, waits: bool) -> None:
        """`waits`: a member asking in the last epoch while pieces are still held elsewhere
        is told to wait (asynchronous runs), not that the run is over, so that a dead
        member's pieces still find a taker; a synchronous run's members never wait, as a
        round would then wait on them."""
        self.geometry, self.lease_seconds, self.waits = geometry, lease_seconds, waits
        self.open: dict[int, _Epoch] = {}
        self.frontier = -1  # the newest epoch opened
        self.leases: dict[Key, Lease] = {}
        # given back after rows of them were trained: how many, to count when dealt again
        self.served_before: dict[Key, int] = {}
        # pieces taken from a holder that had started them: who, and the rows counted then
        # (if it was alive after all and finishes one dealt again, the rest counts too)
        self.lost_by: dict[Key, tuple[int, int, int]] = {}
        # a member's steps the servers have folded (the clock table's), None: not known
        self.steps_of: Callable[[int], int | None] = lambda worker: None
        self.epoch_rows = [0] * geometry.epochs  # rows trained, each once
        self.rows_trained_twice = 0
        self.reissued = 0  # pieces handed out again after a member died or fell silent
        self._open_next()

    # ---- a member's requests -------------------------------------------------------------------
    def take(
        self, worker: int, incarnation: int, epoch: int, hold: bool = False
    ) -> Key | str | None:
        """A piece for a member in `epoch`: one given back from an epoch up to it first,
        else a fresh one; "wait" (see __init__, or a piece is there but `hold`: the run has
        fewer members than its MIN), or None: nothing left up to that epoch."""
        while self.frontier < min(epoch, self.geometry.epochs - 1):
            if self.open.get(self.frontier) is not None and self.open[self.frontier].pending():
                break
            self._open_next()
        for number in sorted(e for e in self.open if e <= epoch):
            opened = self.open[number]
            if hold and opened.pending():
                return "wait"
            if opened.returned:
                return self._lease((number, opened.returned.popleft()), worker, incarnation)
            if opened.fresh < len(opened.done):
                opened.fresh += 1
                return self._lease((number, opened.fresh - 1), worker, incarnation)
        last = epoch >= self.geometry.epochs - 1
        others = any(lease.worker != worker for lease in self.leases.values())
        return "wait" if self.waits and last and others else None

    def start(
        self, worker: int, incarnation: int, key: Key, step: int | None = None, batch: int = 0
    ) -> None:
        """The holder serves the piece's rows from its own `step` on (the count of steps it
        had done: where it said it), `batch` rows a step (where it said it)."""
        lease = self._held(worker, incarnation, key)
        if lease is not None and not lease.started:  # the first word stands
            lease.started, lease.renewed = True, time.monotonic()
            lease.step, lease.batch = step, batch

    def finish(self, worker: int, incarnation: int, key: Key) -> None:
        """The holder trained the piece; a piece it lost meanwhile (its lease ran out, or a
        promoted backup's cursor had it pending) counts too where nobody has taken it again."""
        lease = self._held(worker, incarnation, key)
        opened = self.open.get(key[0])
        lost = self.lost_by.pop(key, None)
        if lost is not None and lost[:2] != (worker, incarnation):
            self.lost_by[key], lost = lost, None  # another holder's: kept
        if lease is None and opened is not None and key[1] in opened.returned:
            opened.returned.remove(key[1])  # given back or restored, then done after all
            self.served_before.pop(key, None)
        elif lease is None:
            if lost is not None:  # alive after all, and dealt again: it trained all of it
                self.rows_trained_twice += self.geometry.rows_of(key[1]) - lost[2]
            return
        else:
            del self.leases[key]
        self._done(key)

    def give_back(self, worker: int, incarnation: int, key: Key, step: int | None = None) -> None:
        """The holder will not finish the piece: one it started goes back as a dead
        member's does (the rows it trained of it, up to its own `step` where it said it,
        count as trained twice once handed out again)."""
        lease = self._held(worker, incarnation, key)
        if lease is not None:
            self._requeue(key, served=lease.started, step=step)

    def renew(self, worker: int, incarnation: int) -> None:
        now = time.monotonic()
        for lease in self.leases.values():
            if lease.worker == worker and lease.incarnation == incarnation:
                lease.renewed = now

    # ---- what becomes of a holder's pieces -----------------------------------------------------
    def leave(self, worker: int, incarnation: int) -> None:
        """The member left cleanly: what it served it trained; the rest goes back."""
        for key, lease in self._of(worker, lambda i: i == incarnation):
            if lease.started:
                del self.leases[key]
                self._done(key)
            else:
                self._requeue(key, served=False)

    def lost(self, worker: int, older_than: int | None = None) -> None:
        """The member died (its incarnations before `older_than`, else every one): its
        pieces go back, and those it served count as trained twice once handed out again."""
        for key, lease in self._of(worker, lambda i: older_than is None or i < older_than):
            self._requeue(key, served=lease.started)

    def expire(self, now: float | None = None) -> None:
        """Pieces whose holder has been silent past the lease go back as a dead one's."""
        now = time.monotonic() if now is None else now
        for key, lease in list(self.leases.items()):
            if now - lease.renewed > self.lease_seconds:
                self._requeue(key, served=lease.started)

    # ---- what the run reads --------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        return {
            "pieces_per_epoch": self.geometry.pieces,
            "epoch_rows": list(self.epoch_rows),
            "rows_trained_twice": self.rows_trained_twice,
            "reissued": self.reissued,
            "held": len(self.leases),
        }

    def cursor(self) -> dict[str, Any]:
        """What a checkpoint keeps, for a resume to go on mid-epoch: the cut, the counts and
        which pieces of each open epoch are done (bits, base64). Pieces held or given back
        are not done: a resumed run deals them again."""
        done = {
            str(e): base64.b64encode(np.packbits(o.done).tobytes()).decode()
            for e, o in self.open.items()
        }
        g = self.geometry
        return {
            "cut": [g.rows, g.piece_rows, g.epochs],
            "frontier": self.frontier,
            "done": done,
            **{k: v for k, v in self.stats().items() if k in RESTORED},
        }

    def restore(self, cursor: Cursor) -> None:
        """Go on from a checkpoint's cursor (parse_cursor's) of the same cut."""
        self.open.clear()
        self.frontier = cursor.frontier
        for epoch, done in cursor.done.items():
            pending = deque(int(p) for p in np.flatnonzero(~done))
            self.open[epoch] = _Epoch(done, fresh=len(done), returned=pending)
        self.epoch_rows = list(cursor.epoch_rows)
        self.rows_trained_twice, self.reissued = cursor.rows_trained_twice, cursor.reissued

    # ---- inside --------------------------------------------------------------------------------
    def _open_next(self) -> None:
        before = self.open.get(self.frontier)
        if before is not None and before.done.all():  # a finished epoch keeps only its count
            self._close(self.frontier)
        if self.frontier + 1 < self.geometry.epochs:
            self.frontier += 1
            self.open[self.frontier] = _Epoch(np.zeros(self.geometry.pieces, bool))

    def _lease(self, key: Key, worker: int, incarnation: int) -> Key:
        if key in self.served_before:
            self.rows_trained_twice += self.served_before.pop(key)
        self.leases[key] = Lease(worker, incarnation)
        return key

    def _held(self, worker: int, incarnation: int, key: Key) -> Lease | None:
        lease = self.leases.get(key)
        if lease is None or (lease.worker, lease.incarnation) != (worker, incarnation):
            return None
        return lease

    def _of(self, worker: int, incarnations: Any) -> list[tuple[Key, Lease]]:
        return [
            (key, lease)
            for key, lease in self.leases.items()
            if lease.worker == worker and incarnations(lease.incarnation)
        ]

    def _requeue(self, key: Key, served: bool, step: int | None = None) -> None:
        lease = self.leases.pop(key)
        self.open[key[0]].returned.appendleft(key[1])
        if served:
            trained = self.served_before[key] = self._trained(key, lease, step)
            self.lost_by[key] = (lease.worker, lease.incarnation, trained)
            self.reissued += 1

    def _trained(self, key: Key, lease: Lease, step: int | None) -> int:
        """Rows of the piece trained before its holder gave it up: its steps from the one
        it started the piece at to `step` (a live holder's word), else to its last step the
        servers folded (a dead one's), times its batch size; the whole piece where any of
        these is not known."""
        whole = self.geometry.rows_of(key[1])
        now = step if step is not None else self.steps_of(lease.worker)
        if lease.step is None or now is None or lease.batch < 1:
            return whole
        done = max(0, now - lease.step)  # the piece's last batch takes the rows left over
        return whole if done >= max(1, whole // lease.batch) else done * lease.batch

    def _done(self, key: Key) -> None:
        epoch, piece = key
        opened = self.open[epoch]
        if opened.done[piece]:
            return
        opened.done[piece] = True
        self.epoch_rows[epoch] += self.geometry.rows_of(piece)
        if epoch != self.frontier and opened.done.all():  # a finished epoch keeps its count
            self._close(epoch)

    def _close(self, epoch: int) -> None:
        """Forget a finished epoch but its count: a former holder that finishes one of its
        pieces after this (alive after all) is not counted, which keeps what is held
        bounded by the open epochs."""
        del self.open[epoch]
        self.lost_by = {key: lost for key, lost in self.lost_by.items() if key[0] != epoch}


RESTORED = ("epoch_rows", "rows_trained_twice", "reissued")


@dataclass(frozen=True)
class Cursor:
    """A checkpoint's cursor, checked: see PieceQueue.cursor."""

    geometry: Geometry
    frontier: int
    done: dict[int, np.ndarray]
    epoch_rows: tuple[int, ...]
    rows_trained_twice: int
    reissued: int


def parse_cursor(saved: object) -> Cursor:
    """A cursor as a checkpoint's metadata holds it, every field checked: a bad one is one
    error saying which."""
    if not isinstance(saved, dict):
        raise ValueError(f"the checkpoint's data cursor must be a map, got {type(saved).__name__}")
    cut, done = saved.get("cut"), saved.get("done")
    if not (isinstance(cut, list) and len(cut) == 3 and all(count(v) for v in cut)):
        raise ValueError(f"the checkpoint's data cursor has no valid cut: {cut!r}")
    geometry = Geometry(*cut)
    if geometry.pieces > MAX_PIECES or geometry.epochs > MAX_EPOCHS:
        raise ValueError(f"the checkpoint's data cursor cuts too many pieces: {cut!r}")
    frontier, rows = saved.get("frontier"), saved.get("epoch_rows")
    if not (count(frontier, -1) and frontier < geometry.epochs):  # type: ignore[operator]
        raise ValueError(f"the checkpoint's data cursor has no valid frontier: {frontier!r}")
    if not (isinstance(rows, list) and len(rows) == geometry.epochs):
        raise ValueError("the checkpoint's data cursor has no row count for each epoch")
    if not (isinstance(done, dict) and len(done) <= geometry.epochs):
        raise ValueError("the checkpoint's data cursor has no valid done pieces")
    opened: dict[int, np.ndarray] = {}
    for key, bits in done.items():
        try:
            epoch = int(key)
            packed = np.frombuffer(base64.b64decode(bits, validate=True), np.uint8)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the checkpoint's data cursor, epoch {key!r}: {exc}") from None
        if not 0 <= epoch <= frontier or len(packed) != (geometry.pieces + 7) // 8:  # type: ignore[operator]
            raise ValueError(f"the checkpoint's data cursor, epoch {key!r}: not of its cut")
        opened[epoch] = np.unpackbits(packed)[: geometry.pieces].astype(bool)
    counts = [saved.get(name) for name in ("rows_trained_twice", "reissued")]
    if not all(count(v, 0) for v in (*rows, *counts)):
        raise ValueError("the checkpoint's data cursor holds a count that is not one")
    return Cursor(geometry, frontier, opened, tuple(rows), counts[0], counts[1])  # type: ignore[arg-type]


def count(value: object, minimum: int = 1) -> bool:
    """Whether `value` is an integer (not a bool) from `minimum` up to 2**53."""
    return isinstance(value, int) and not isinstance(value, bool) and minimum <= value < 1 << 53
