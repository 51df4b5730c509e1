"""Spark engine helpers that need no JVM: a stopped SparkContext, a frame's partition count."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import pytest

from ember.engines.spark import partition_count
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
    ("rows", "workers", "parallelism", "expected"),
    [
        (60_000, 2, 2, 2),  # two batches, two slots: both rules agree, Spark is not asked
        (60_000, 2, 4, 7),  # the slots differ from the batches: Spark is asked
        (6, 4, 4, 7),  # ceil(6 / ceil(6 / 4)) = 3 batches for 4 workers: Spark is asked
    ],
)
def test_the_partition_count_is_asked_of_spark_unless_both_rules_agree(
    rows: int, workers: int, parallelism: int, expected: int
) -> None:
    spark = SimpleNamespace(sparkContext=SimpleNamespace(defaultParallelism=parallelism))
    frame = SimpleNamespace(rdd=SimpleNamespace(getNumPartitions=lambda: 7))
    assert partition_count(spark, frame, rows, workers) == expected
