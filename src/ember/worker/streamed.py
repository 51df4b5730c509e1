"""A worker range's rows streamed from disk (--data-mode stream): each epoch the stored pieces
of the user's files (Parquet row groups, .npy windows, .npz shards) are laid end to end in
an order the seed and the epoch fix, and dealt piece p is rows [p * piece_rows, ...) of
that. A member reads a piece's rows when it is dealt, shuffles them (seeded by the epoch and
the piece) and cuts them into batches, so every member cuts a piece the same way and no row
is read by two members in one epoch unless a piece is dealt twice.

The cut depends on the user's files alone: a member that reads a copy laid out otherwise
(the local engine decodes Parquet once into .npy) reads the same rows by their place in
file order, which the copy keeps.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from functools import lru_cache, partial

import numpy as np
import torch

from ember.data.batches import Batch, as_tensor
from ember.data.stream import StreamPlan, read_piece
from ember.data.streaming import DataCounters
from ember.ps.pieces import Geometry, Key
from ember.worker.pieces import PIECES_PER_MEMBER, batch_cuts, piece_batches

# Stored pieces kept decoded: a row group wider than a piece serves the member's next
# pieces of it (consecutive pieces of the arrangement) without being read again.
KEPT_STORED = 2


class StreamedPieces:
    """A streamed plan's rows, dealt in pieces read from disk as they are dealt."""

    def __init__(
        self,
        plan: StreamPlan,
        batch_size: int,
        seed: int,
        groups: tuple[int, ...] = (),
        shape: tuple[int, ...] | None = None,
    ) -> None:
        """`groups`: rows of each stored piece of the user's files, where `plan` reads a
        copy laid out otherwise (StreamFiles.groups); by default the plan's pieces. `shape`:
        a row's as the model takes it, where the files hold it flat (rows a Spark run wrote
        from images); by default the plan's."""
        self.plan, self.batch_size, self.seed = plan, batch_size, seed
        self.shape = tuple(shape or plan.input_shape)
        self.groups = groups or tuple(p.rows for p in plan.pieces)
        self.rows = plan.rows
        if sum(self.groups) != self.rows:
            raise ValueError(f"{sum(self.groups)} rows in groups, {self.rows} in the plan")
        # where each of the plan's pieces ends in file order
        self._plan_ends = np.cumsum([p.rows for p in plan.pieces])
        self.counters = DataCounters("stream")
        self._kept: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        if any(p.kind == "parquet" for p in plan.pieces):
            import pyarrow.parquet  # noqa: F401 - now, not in the first step's wait

    def piece_rows(self, members: int) -> int:
        """As many rows as a stored piece holds (one read serves a dealt piece), rounded to
        whole batches, between the rows-in-memory cut's (the least for the dealing's cost)
        and the most that still give each member PIECES_PER_MEMBER pieces an epoch."""
        size = self.batch_size
        least = size * piece_batches(self.rows // size, members)
        most = self.rows // (PIECES_PER_MEMBER * max(1, members)) // size * size
        stored = int(np.median(self.groups)) // size * size
        return max(least, min(stored, most))

    def cut(self, key: Key, geometry: Geometry) -> list[Callable[[], Batch]]:
        """The piece's rows, read now and shuffled, as batches (the last taking the rows left
        over): views of one copy, so a batch costs nothing more at its step."""
        epoch, piece = key
        first = piece * geometry.piece_rows
        x, y = self._rows(epoch, first, first + geometry.rows_of(piece))
        x = x.reshape(len(x), *self.shape)
        mixed = torch.from_numpy(np.random.default_rng([self.seed, 0x5D1CE, epoch, piece])
                                 .permutation(len(y)))  # fmt: skip
        features, targets = as_tensor(x)[mixed], as_tensor(y)[mixed]
        cuts = batch_cuts(torch.arange(len(y)), self.batch_size)
        return [partial(_rows_of, features, targets, int(c[0]), len(c)) for c in cuts]

    def _rows(self, epoch: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows [lo, hi) of epoch `epoch`'s arrangement of the stored pieces."""
        order, ends, starts = _arrangement(self.seed, epoch, self.groups)
        xs, ys = [], []
        at = int(np.searchsorted(ends, lo, side="right"))
        while at < len(order) and ends[at] - self.groups[order[at]] < hi:
            begins = int(ends[at]) - self.groups[order[at]]  # in the arrangement
            a, b = max(lo, begins) - begins, min(hi, int(ends[at])) - begins
            first = int(starts[order[at]])  # the group's first row in file order
            for x, y in self._in_file_order(first + a, first + b):
                xs.append(x)
                ys.append(y)
            at += 1
        return np.concatenate(xs), np.concatenate(ys)

    def _in_file_order(self, lo: int, hi: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Rows [lo, hi) of the plan in file order, as parts of its stored pieces."""
        parts, at = [], int(np.searchsorted(self._plan_ends, lo, side="right"))
        while at < len(self.plan.pieces) and self._plan_ends[at] - self.plan.pieces[at].rows < hi:
            begins = int(self._plan_ends[at]) - self.plan.pieces[at].rows
            x, y = self._stored(at)
            a, b = max(lo, begins) - begins, min(hi, int(self._plan_ends[at])) - begins
            parts.append((x[a:b], y[a:b]))
            at += 1
        return parts

    def _stored(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Stored piece `index`'s rows, decoded once while it stays among the last kept."""
        if index in self._kept:
            self._kept.move_to_end(index)
            return self._kept[index]
        began = time.perf_counter()
        plan = self.plan
        rows = read_piece(plan.pieces[index], plan.input_shape, plan.targets)
        spent = time.perf_counter() - began
        self.counters.rows_read += len(rows[1])
        self.counters.seconds += spent
        self.counters.read_wait += spent
        self._kept[index] = rows
        while len(self._kept) > KEPT_STORED:
            self._kept.popitem(last=False)
        return rows


def _rows_of(features: torch.Tensor, targets: torch.Tensor, start: int, rows: int) -> Batch:
    return features.narrow(0, start, rows), targets.narrow(0, start, rows)


@lru_cache(maxsize=2)  # this epoch's, and an earlier one's for a piece given back
def _arrangement(
    seed: int, epoch: int, groups: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The stored pieces in epoch `epoch`'s order, where each ends in rows laid end to end
    so, and where each starts in file order: fixed by the seed and the epoch alone."""
    rows = np.asarray(groups, dtype=np.int64)
    order = np.random.default_rng([seed, 0x91ECE, epoch]).permutation(len(rows))
    return order, np.cumsum(rows[order]), np.cumsum(rows) - rows


__all__ = ["StreamedPieces"]
