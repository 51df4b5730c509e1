"""Spark engine helpers that need no JVM: a stopped SparkContext, a frame's partitions."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import pytest

from ember.data.spark import FrameFacts
from ember.engines.spark_session import stopped


def _context(is_stopped: Callable[[], bool]) -> SimpleNamespace:
    """A stand-in for a SparkContext, down to the JVM call `stopped` makes."""
    return SimpleNamespace(_jsc=SimpleNamespace(sc=lambda: SimpleNamespace(isStopped=is_stopped)))


def test_a_context_counts_as_stopped_when_its_jvm_says_so_or_no_longer_answers() -> None:
    def jvm_gone() -> bool:
        raise ConnectionRefusedError(111, "Connection refused")

    assert not stopped(_context(lambda: False))
    assert stopped(_context(lambda: True))
    assert stopped(_context(jvm_gone))


@pytest.mark.parametrize(
    ("rows", "workers", "sizes"),
    [
        (60_000, 2, (30_000, 30_000)),
        (60_001, 2, (30_001, 30_000)),
        (10, 4, (3, 3, 3, 1)),
        (6, 4, (2, 2, 2)),  # three batches for four workers
    ],
)
def test_a_frame_of_local_rows_has_one_partition_per_arrow_batch(
    rows: int, workers: int, sizes: tuple[int, ...]
) -> None:
    assert FrameFacts.local(rows, workers, 784, 9).partition_rows == sizes
