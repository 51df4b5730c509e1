"""Spark engine helpers that need no JVM: a stopped SparkContext, a frame's partitions, the
Java options of a local session."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from ember.data.spark import FrameFacts
from ember.engines import spark_jvm
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


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pytest.importorskip("pyspark", reason="the archive's name depends on pyspark's version")
    if spark_jvm.java_binary() is None:
        pytest.skip("no Java runtime here")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(spark_jvm.ARCHIVE_SWITCH, raising=False)
    return tmp_path / "ember"


def test_the_first_local_jvm_writes_a_class_archive_and_later_ones_read_it(cache: Path) -> None:
    stale = cache / "spark-classes-0000000000000000.jsa"
    cache.mkdir()
    stale.write_bytes(b"of another Java runtime")
    first = spark_jvm.local_driver_options().split()
    archive = spark_jvm.class_archive()
    assert archive is not None and archive.parent == cache
    assert first == [
        *spark_jvm.SHORT_LIVED.split(),
        f"-XX:ArchiveClassesAtExit={archive}",
        "-Xlog:cds*=off",
    ]
    assert not stale.exists()
    archive.write_bytes(b"as the first JVM left it")
    later = spark_jvm.local_driver_options().split()
    assert later[-2:] == [f"-XX:SharedArchiveFile={archive}", "-Xlog:cds*=off"]


def test_the_class_archive_can_be_switched_off(cache: Path, monkeypatch) -> None:
    monkeypatch.setenv(spark_jvm.ARCHIVE_SWITCH, "off")
    assert spark_jvm.local_driver_options() == spark_jvm.SHORT_LIVED
    assert not cache.exists()


def test_an_archive_path_with_spaces_stays_one_java_option(tmp_path, monkeypatch) -> None:
    pytest.importorskip("pyspark")
    if spark_jvm.java_binary() is None:
        pytest.skip("no Java runtime here")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "my cache"))
    options = shlex.split(spark_jvm.local_driver_options())
    archive = spark_jvm.class_archive()
    assert f"-XX:ArchiveClassesAtExit={archive}" in options
