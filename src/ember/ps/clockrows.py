"""The clock table as it travels in a payload frame (snapshots, replica copies): int64 rows
of COLUMNS, their layout in a tensor table, their checks, and a checkpoint's view of them.

A table of any size fits a payload; a header holds at most 64 KiB.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ember.errors import ProtocolError
from ember.wire import gather

COLUMNS = ("worker", "incarnation", "clock", "step", "seq", "live", "finished")
MAX_ID = 1 << 62  # worker ids and incarnations: they travel as int64 in the rows
# The most rows any table may have (what a reader accepts): the most workers a run may have,
# config's MAX_WORKERS (tests/unit/test_codec.py keeps the two equal: ps imports no config).
MAX_TABLE_ROWS = 1 << 20
_I64 = np.iinfo(np.int64)


def pack_rows(rows: Iterable[tuple[int, ...]]) -> np.ndarray:
    """Rows of COLUMNS as one int64 array. A worker's own step and numbers are whatever it
    sent: clamped to int64, never overflowing."""
    values = [[min(max(int(v), _I64.min), _I64.max) for v in row] for row in rows]
    return np.array(values, dtype=np.int64).reshape(-1, len(COLUMNS))


def table_layout(rows: int) -> list[Any]:
    """The tensor-table entry of a table of `rows` rows."""
    return ["int64", [rows, len(COLUMNS)]]


def check_layout(layout: object, max_rows: int) -> int:
    """The row count a table's tensor-table entry declares, if it is one of at most
    `max_rows` rows."""
    shape = layout[1] if isinstance(layout, list) and len(layout) == 2 else None
    count = shape[0] if isinstance(shape, list) and shape else None
    if not (type(count) is int and count >= 0 and layout == table_layout(count)):
        raise ProtocolError(f"workers must be a tensor {table_layout(max_rows)}, got {layout!r}")
    if count > max_rows:
        raise ProtocolError(f"workers has {count} rows, more than the {max_rows} allowed")
    return count


def read_rows(layout: object, chunks: list[np.ndarray], max_rows: int) -> np.ndarray:
    """A table received as a payload tensor: its declared `layout` and its chunk views (as
    tensors_from_frames hands them over), copied out and checked."""
    rows = np.empty((check_layout(layout, max_rows), len(COLUMNS)), dtype=np.int64)
    gather(chunks, rows.reshape(-1))
    return check_rows(rows, max_rows)


def check_rows(rows: object, max_rows: int) -> np.ndarray:
    """Rows as `rows()` writes them, or a ProtocolError naming what is wrong."""
    width = len(COLUMNS)
    if not (
        isinstance(rows, np.ndarray)
        and rows.dtype == np.int64
        and rows.ndim == 2
        and rows.shape[1] == width
    ):
        raise ProtocolError(f"workers must be int64 rows of {list(COLUMNS)}")
    if len(rows) > max_rows:
        raise ProtocolError(f"workers has {len(rows)} rows, more than the {max_rows} allowed")
    columns = dict(zip(COLUMNS, rows.T, strict=True))
    for name, low, high in (("worker", 0, MAX_ID), ("incarnation", -1, MAX_ID)):
        bad = (columns[name] < low) | (columns[name] >= high)
        if bad.any():
            raise ProtocolError(
                f"workers: {name} {int(columns[name][bad][0])} is outside [{low}, {high})"
            )
    for name in ("live", "finished"):
        bad = (columns[name] != 0) & (columns[name] != 1)
        if bad.any():
            raise ProtocolError(f"workers: {name} must be 0 or 1, got {int(columns[name][bad][0])}")
    ids, counts = np.unique(columns["worker"], return_counts=True)
    if (counts > 1).any():
        raise ProtocolError(f"workers: worker {int(ids[counts > 1][0])} has more than one row")
    return rows


def rows_to_table(rows: np.ndarray) -> dict[str, dict[str, int]]:
    """Checked rows as a checkpoint's workers table: worker id -> clock, step, finished,
    incarnation."""
    return {
        str(worker): {
            "clock": clock,
            "step": step,
            "finished": bool(finished),
            "incarnation": incarnation,  # -1 until the worker registers
        }
        for worker, incarnation, clock, step, _seq, _live, finished in rows.tolist()
    }
