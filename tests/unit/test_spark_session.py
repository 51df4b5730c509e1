"""The Spark session helpers that need no JVM: telling a stopped SparkContext from a live one."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

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
