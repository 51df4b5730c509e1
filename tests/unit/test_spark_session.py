"""Spark engine helpers that need no JVM: a stopped SparkContext, a frame's partitions, the
Java options of a local session."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from ember.data.spark import FrameFacts
from ember.engines.spark import jvm as spark_jvm
from ember.engines.spark.session import stopped


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


def test_a_local_jvm_lists_its_classes_until_there_is_an_archive(cache: Path) -> None:
    archive = spark_jvm.class_archive()
    assert archive is not None and archive.path.parent == cache
    short_lived = spark_jvm.SHORT_LIVED.split()
    first = spark_jvm.local_driver_options(archive).split()
    assert first == [*short_lived, f"-XX:DumpLoadedClassList={archive.class_list}"]
    archive.path.write_bytes(b"as the writer left it")
    later = spark_jvm.local_driver_options(archive).split()
    assert later == [*short_lived, f"-XX:SharedArchiveFile={archive.path}", "-Xlog:cds*=off"]
    archive.path.unlink()
    archive.discard()
    archive.failed.write_text("java exited with 1")  # a failed write is not retried
    assert spark_jvm.local_driver_options(archive) == spark_jvm.SHORT_LIVED


def test_one_process_at_a_time_lists_the_classes(cache: Path) -> None:
    archive = spark_jvm.class_archive()
    assert archive is not None
    other = subprocess.Popen(["sleep", "30"])
    try:  # a live run holds the claim: this one neither lists nor writes
        archive.claim.write_text(spark_jvm._identity(other.pid))
        assert archive.java_options() == ""
    finally:
        other.kill()
        other.wait(10)
    # its holder is gone: the claim is taken over
    assert archive.java_options() == f"-XX:DumpLoadedClassList={archive.class_list}"
    assert archive.claim.read_text() == spark_jvm._identity(os.getpid())
    archive.class_list.write_text("java/lang/Object\n")
    archive.discard()  # a session that failed to start gives both up
    assert not archive.class_list.exists() and not archive.claim.exists()


def test_an_archive_path_with_spaces_stays_one_java_option(cache: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache.parent / "my cache"))
    archive = spark_jvm.class_archive()
    assert archive is not None
    options = shlex.split(spark_jvm.local_driver_options(archive))
    assert f"-XX:DumpLoadedClassList={archive.class_list}" in options
    archive.path.write_text("written")
    options = shlex.split(spark_jvm.local_driver_options(archive))
    assert f"-XX:SharedArchiveFile={archive.path}" in options


def test_the_class_archive_can_be_switched_off(cache: Path, monkeypatch) -> None:
    monkeypatch.setenv(spark_jvm.ARCHIVE_SWITCH, "off")
    assert spark_jvm.class_archive() is None
    assert spark_jvm.local_driver_options(None) == spark_jvm.SHORT_LIVED
    assert not cache.exists()


FAKE_JAVA = """#!/bin/sh
# reads its class list and writes its -XX:SharedArchiveFile=PATH, or fails when FAIL is set
[ -n "$FAIL" ] && exit 3
for arg in "$@"; do
  case "$arg" in -XX:SharedClassListFile=*) [ -f "${arg#*=}" ] || exit 4;; esac
done
for arg in "$@"; do
  case "$arg" in -XX:SharedArchiveFile=*) echo archived > "${arg#*=}";; esac
done
"""


@pytest.mark.parametrize("fails", [False, True])
def test_the_writer_moves_a_whole_archive_into_place_or_marks_the_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: bool
) -> None:
    java = tmp_path / "java"
    java.write_text(FAKE_JAVA)
    java.chmod(0o755)
    if fails:
        monkeypatch.setenv("FAIL", "1")
    archive = spark_jvm.ClassArchive(tmp_path / "spark-classes-new.jsa")
    gone = subprocess.Popen(["true"])  # the JVM that listed the classes, exited
    gone.wait(10)
    unused, recent = tmp_path / "spark-classes-old.jsa", tmp_path / "spark-classes-else.jsa"
    orphan = tmp_path / f"spark-classes-new.{gone.pid}.partial"  # of a writer that died
    for leftover in (unused, recent, orphan):
        leftover.write_text("of another runtime, or another writer")
    a_month_ago = time.time() - 31 * 86400
    os.utime(unused, (a_month_ago, a_month_ago))
    # the run's class list is named after its process, gone too by the time the JVM is
    classes = tmp_path / f"spark-classes-new.{gone.pid}.classlist"
    classes.write_text("java/lang/Object\n")
    archive.claim.write_text(spark_jvm._identity(os.getpid()))  # handed to this writer
    code = spark_jvm.write_archive(gone.pid, str(java), "a.jar", classes, archive.path)
    assert not classes.exists() and not orphan.exists() and not unused.exists()
    assert recent.exists() and not archive.claim.exists()
    assert not list(tmp_path.glob("*.partial"))
    if fails:
        assert code == 1 and not archive.path.exists() and archive.failed.exists()
    else:
        assert code == 0 and archive.path.read_text() == "archived\n"
        assert not archive.failed.exists()
