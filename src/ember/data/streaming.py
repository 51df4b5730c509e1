"""A worker's shard streamed from disk as minibatches: its pieces in a fresh seeded order each
epoch, read ahead on a background thread, rows mixed in a bounded shuffle buffer; and the
counters every ShardBatches reports (rows read, seconds the step waited on data).

imports: numpy and the data part (whose batches are torch tensors)
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from ember.data.batches import Batch, ShardBatches, as_tensor
from ember.data.store import MappedRows
from ember.data.stream import Piece, read_piece, read_row_numbers
from ember.errors import ConfigError, EmberError

READ_AHEAD = 2  # pieces read while the step trains on the one before: memory is depth x piece
POLL_SECONDS = 0.25  # how often a blocked side looks up to see whether the other gave up
STALL_SECONDS = 600.0  # one piece not read in this long: the disk or file system is stuck
_END = object()  # the reader read its last piece


@dataclass
class DataCounters:
    """What a worker's rows cost it, totals since the worker started."""

    mode: str  # "memory" or "stream"
    rows_read: int = 0  # rows read from the source (a resumed stream reads its skipped ones)
    seconds: float = 0.0  # the step waited for its batch (shuffle and copy included)
    read_wait: float = 0.0  # of which blocked on the read-ahead thread, i.e. on the disk
    _seen: float = 0.0  # `seconds` at the last interval()
    _clock: float = 0.0  # perf_counter() then

    def record(self) -> dict[str, object]:
        """metrics.jsonl's (and summary.json's) fields."""
        return {
            "data_mode": self.mode,
            "rows_read": self.rows_read,
            "data_wait_seconds": self.seconds,
            "read_wait_seconds": self.read_wait,
            "peak_rss_bytes": _peak_rss(),
        }

    def interval(self) -> float:
        """The share of the time since the last call that the step waited on data."""
        now = time.perf_counter()
        spent, elapsed = self.seconds - self._seen, now - self._clock
        self._seen, self._clock = self.seconds, now
        return min(1.0, spent / elapsed) if elapsed > 0 else 0.0


def _peak_rss() -> int:
    """This process's peak resident set (VmHWM) in bytes: what holding its rows cost it;
    0 where /proc does not say."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class Counted:
    """Any ShardBatches with its batches counted and the time taken to produce them timed."""

    def __init__(self, inner: ShardBatches, mode: str = "memory") -> None:
        self.inner, self.rows, self.batch_size = inner, inner.rows, inner.batch_size
        self.counters = getattr(inner, "counters", None) or DataCounters(mode)
        self.counters._clock = time.perf_counter()

    def __getattr__(self, name: str) -> Any:
        """The wrapped batches' own attributes (MemoryBatches' tensors), as if unwrapped."""
        return getattr(self.inner, name)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        counters, memory = self.counters, self.counters.mode == "memory"
        batches = self.inner.epoch(epoch, start)
        while True:
            began = time.perf_counter()
            batch = next(batches, None)
            counters.seconds += time.perf_counter() - began
            if batch is None:
                return
            if memory:
                counters.rows_read += len(batch[1])
            yield batch


class StreamBatches:
    """A shard of `pieces` read from disk each epoch: held in memory are at most the shuffle
    buffer, READ_AHEAD pieces and the batch being cut, whatever the shard's size."""

    def __init__(
        self,
        pieces: tuple[Piece, ...],
        input_shape: tuple[int, ...],
        num_classes: int,
        batch_size: int,
        seed: int,
        rank: int,
        shuffle_buffer: int,
        targets: tuple[str, tuple[int, ...]] = ("classes", ()),  # their kind and a row's shape
    ) -> None:
        self.pieces, self.shape, self.num_classes = pieces, tuple(input_shape), num_classes
        self.targets = targets
        self.rows, self.batch_size = sum(p.rows for p in pieces), batch_size
        self.key, self.buffer = (seed, rank), max(1, shuffle_buffer)
        self.counters = DataCounters("stream")
        self.ahead: tuple[int, ReadAhead] | None = None  # the next epoch's, once started
        # Rows of one .npy file (the local engine's decoded copy) are gathered from its
        # mapping by row number: the pool mixes numbers, and a row is copied once, not three
        # times (read, into the pool, out of it), which a row cheaper to train than to copy
        # pays for in samples/s.
        self.mapped = MappedRows(pieces[0].path) if _one_npy_file(pieces) else None
        if any(p.kind == "parquet" for p in pieces):
            import pyarrow.parquet  # noqa: F401 - now, not in the first step's wait

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """As MemoryBatches: batches from `start` on, fixed by seed, rank and epoch; a resumed
        epoch reads its first `start` batches' rows again (time, not memory) and drops them."""
        reader = self._reader(epoch)
        size, index, total = self.batch_size, 0, self.rows // self.batch_size
        pending: list[tuple[np.ndarray, np.ndarray]] = []
        held = 0
        try:
            for x, y in reader.chunks():
                pending.append((x, y))
                held += len(y)
                while held >= size and index < total:
                    batch, held = _cut(pending, size), held - size
                    if index >= start:
                        rows = batch[0] if self.mapped is None else self.mapped.take(batch[0])
                        yield as_tensor(rows), as_tensor(batch[1])
                    index += 1
        finally:
            reader.close()

    def _reader(self, epoch: int) -> ReadAhead:
        """Epoch `epoch`'s reader: the one started as the epoch before ended, if it was."""
        ahead, self.ahead = self.ahead, None
        if ahead is not None and ahead[0] == epoch:
            return ahead[1]
        if ahead is not None:
            ahead[1].close()
        order = np.random.default_rng([*self.key, epoch, 0]).permutation(len(self.pieces))
        rng = np.random.default_rng([*self.key, epoch, 1])
        kind, target_shape = self.targets
        dtype = np.int64 if kind == "classes" else np.float32
        if self.mapped is None:
            pool = ShufflePool(self.buffer, self.shape, rng, (dtype, target_shape))
        else:  # rows by their numbers in the file
            pool = ShufflePool(self.buffer, (), rng, (dtype, target_shape), np.int64)
        return ReadAhead(
            [self.pieces[i] for i in order],
            (self.shape, self.num_classes, kind),
            pool,
            self.counters,
            lambda: self._read_next(epoch + 1),
            by_number=self.mapped is not None,
        )

    def _read_next(self, epoch: int) -> None:
        """Start reading `epoch` while this one's pool drains (on this one's reader thread):
        its first rows are then mixed when its first step asks. A run's last epoch leaves
        such a reader unused; it stops once nobody took anything for STALL_SECONDS."""
        if self.ahead is None:
            self.ahead = (epoch, self._reader(epoch))


def _one_npy_file(pieces: tuple[Piece, ...]) -> bool:
    return bool(pieces) and all(p.kind == "npy" and p.path == pieces[0].path for p in pieces)


def _cut(pending: list[tuple[np.ndarray, np.ndarray]], size: int) -> tuple[np.ndarray, np.ndarray]:
    """The first `size` rows of `pending` (a view when one array holds them), taken off it."""
    first_x, first_y = pending[0]
    if len(first_y) >= size:
        pending[0] = (first_x[size:], first_y[size:])
        if len(first_y) == size:
            pending.pop(0)
        return first_x[:size], first_y[:size]
    xs, ys, need = [], [], size
    while need:
        x, y = pending[0]
        take = min(need, len(y))
        xs.append(x[:take])
        ys.append(y[:take])
        need -= take
        if take == len(y):
            pending.pop(0)
        else:
            pending[0] = (x[take:], y[take:])
    return np.concatenate(xs), np.concatenate(ys)


class ShufflePool:
    """A bounded shuffle buffer (tf.data's shuffle, a chunk at a time): rows go in until it
    holds `capacity`; after that each row that goes in takes the slot of a row drawn uniformly
    from those held, which comes out. Two copies a row: into its slot, and out of it."""

    def __init__(
        self,
        capacity: int,
        shape: tuple[int, ...],
        rng: np.random.Generator,
        targets: tuple[type, tuple[int, ...]] = (np.int64, ()),  # their dtype and a row's shape
        features: type = np.float32,  # or int64: rows by their numbers in a mapped file
    ) -> None:
        self.capacity, self.rng, self.held = capacity, rng, 0
        self.shape, self.targets, self.features = shape, targets, features
        self.x: np.ndarray = np.empty((0, *shape), dtype=features)
        self.y: np.ndarray = np.empty((0, *targets[1]), dtype=targets[0])

    def add(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Take a chunk (at most `capacity` rows) in; the rows it displaced, in random order
        (none while the pool fills)."""
        room = min(self.capacity - self.held, len(y))
        if room > 0:
            held = self.held + room
            if held > len(self.y):  # grows by doubling up to capacity, then stays
                self._grow(min(self.capacity, max(held, 2 * len(self.y))))
            self.x[self.held : held], self.y[self.held : held] = x[:room], y[:room]
            self.held, x, y = held, x[room:], y[room:]
        slots = self.rng.choice(self.capacity, len(y), replace=False)  # in random order
        out = self.x[slots], self.y[slots]
        self.x[slots], self.y[slots] = x, y
        return out

    def drain(self) -> tuple[np.ndarray, np.ndarray]:
        """Every row still held, in random order; the pool is then empty."""
        order = self.rng.permutation(self.held)
        self.held = 0
        return self.x[order], self.y[order]

    def _grow(self, rows: int) -> None:
        x: np.ndarray = np.empty((rows, *self.shape), self.features)
        y: np.ndarray = np.empty((rows, *self.targets[1]), self.targets[0])
        x[: self.held], y[: self.held] = self.x[: self.held], self.y[: self.held]
        self.x, self.y = x, y


class ReadAhead:
    """Reads `pieces` in order on a thread of its own and mixes their rows in `pool` there,
    READ_AHEAD chunks ahead of the step, so the step's thread only cuts batches. An error on
    that thread (a truncated file, a changed schema) is raised in the step's thread, naming
    the file and piece."""

    def __init__(
        self,
        pieces: list[Piece],
        rows: tuple[tuple[int, ...], int, str],  # a row's shape, the output width, targets' kind
        pool: ShufflePool,
        counters: DataCounters,
        then: Callable[[], None],
        by_number: bool = False,  # rows as their numbers in the pieces' .npy file
    ) -> None:
        self.pieces, (self.shape, self.num_classes, self.kind), self.pool = pieces, rows, pool
        self.counters, self.then, self.by_number = counters, then, by_number
        self.queue: queue.Queue[object] = queue.Queue(maxsize=READ_AHEAD)
        self.stop = threading.Event()
        self.reading: Piece | None = None  # what the thread is reading, for a stall's error
        self.thread = threading.Thread(target=self._run, name="ember-read-ahead", daemon=True)
        self.thread.start()

    def chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The rows the pool let out, in order: at most a shuffle buffer's worth at a time."""
        while True:
            item = self._get()
            if item is _END:
                return
            x, y = cast("tuple[np.ndarray, np.ndarray]", item)
            self.counters.rows_read += len(y)  # taken, not read: a next epoch may never run
            yield x, y

    def close(self) -> None:
        """Stop the thread (an epoch left early, or ended) and let go of what it read."""
        self.stop.set()
        while not self.queue.empty():
            self.queue.get_nowait()
        self.thread.join(timeout=10 * POLL_SECONDS)

    def _get(self) -> object:
        began = time.perf_counter()
        deadline = time.monotonic() + STALL_SECONDS
        try:
            while True:
                try:
                    item = self.queue.get(timeout=POLL_SECONDS)
                    break
                except queue.Empty:
                    if not self.thread.is_alive() and self.queue.empty():
                        raise EmberError("the read-ahead thread ended without a word") from None
                    if time.monotonic() > deadline:
                        where = self.reading.where if self.reading else "the data"
                        raise ConfigError(f"{where}: not read within {STALL_SECONDS:g}s") from None
        finally:
            self.counters.read_wait += time.perf_counter() - began
        if isinstance(item, BaseException):
            raise item  # the reader's error, with its traceback, where the step can stop
        return item

    def _run(self) -> None:
        pool, most = self.pool, self.pool.capacity
        try:
            for piece in self.pieces:
                self.reading = piece
                if self.by_number:
                    x, y = read_row_numbers(piece)
                else:
                    x, y = read_piece(piece, self.shape, self.kind)
                if self.kind == "classes" and len(y) and y.max() >= self.num_classes:
                    raise ConfigError(
                        f"{piece.where}: label {int(y.max())} is outside [0,"
                        f" {self.num_classes}), the classes the model was built for"
                    )
                for at in range(0, len(y), most):  # the pool takes at most its capacity
                    out = pool.add(x[at : at + most], y[at : at + most])
                    if len(out[1]) and not self._put(out):
                        return
            if not self.stop.is_set():
                self.then()  # before the drain's rows: a step that took them sees it started
            if self._put(pool.drain()):
                self._put(_END)
        except BaseException as exc:  # every error is the step's to raise
            self._put(exc)

    def _put(self, item: object) -> bool:
        """Hand `item` to the step; False when the step gave up on this epoch, or nobody
        took anything for STALL_SECONDS (a next epoch read ahead that never came)."""
        deadline = time.monotonic() + STALL_SECONDS
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                self.queue.put(item, timeout=POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False


def stream_record(batches: object) -> dict[str, object]:
    """summary.json's and metrics.jsonl's data fields of a worker's batches (none if it has
    no counters, as a user's own loop)."""
    counters = getattr(batches, "counters", None)
    return counters.record() if isinstance(counters, DataCounters) else {}


def data_wait_fraction(batches: object) -> float:
    """The share of the time since the last call that the step waited on `batches`."""
    counters = getattr(batches, "counters", None)
    return counters.interval() if isinstance(counters, DataCounters) else 0.0


__all__ = ["Counted", "DataCounters", "ShufflePool", "StreamBatches", "stream_record"]
