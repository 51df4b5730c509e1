"""Spark engine helpers that need no JVM: a stopped SparkContext, a frame's partitions, the
Java options of a local session, the masters and task slots accepted, where servers listen."""

from __future__ import annotations

import errno
import os
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from ember.config import RunConfig
from ember.data.spark import FrameFacts
from ember.engines.addresses import Placement, bind_first, local_address, placement, port_of
from ember.engines.spark import jvm as spark_jvm
from ember.engines.spark import session as spark_session
from ember.engines.spark.session import check_master, executor_slots, stopped
from ember.errors import ConfigError, EmberError


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


# ---- masters, executors' task slots and where the servers listen ------------------------------


class _Seq:
    """A Scala Seq as py4j hands it over: size() and apply(i), not iteration."""

    def __init__(self, items: list) -> None:
        self.items = items

    def size(self) -> int:
        return len(self.items)

    def apply(self, index: int):
        return self.items[index]


def _executor(name: str, cores: int) -> SimpleNamespace:
    return SimpleNamespace(id=lambda: name, totalCores=lambda: cores)


def _cluster(executors: Callable[[], list], parallelism: int = 2) -> SimpleNamespace:
    """A SparkContext whose status store lists what `executors()` returns when asked."""
    store = SimpleNamespace(executorList=lambda active: _Seq(executors()))
    jsc = SimpleNamespace(sc=lambda: SimpleNamespace(statusStore=lambda: store))
    return SimpleNamespace(_jsc=jsc, defaultParallelism=parallelism)


def _config(**fields) -> RunConfig:
    return RunConfig(engine="spark", **fields).validate()


def _no_setting(key: str, default):
    return default


@pytest.mark.parametrize(
    "master", ["spark://host0:7077", "spark://a:7077,b:7077", "yarn", "k8s://https://api:443"]
)
def test_a_cluster_master_is_accepted_before_its_executors_can_be_counted(master) -> None:
    check_master(_config(workers=64), master, _no_setting)


def test_an_unknown_master_is_refused_naming_the_ones_ember_knows() -> None:
    with pytest.raises(ConfigError) as error:
        check_master(_config(), "mesos://host:5050", _no_setting)
    assert str(error.value) == (
        "master 'mesos://host:5050' is not a Spark master URL ember knows: use local[N],"
        " local-cluster[N, CORES, MB], spark://HOST:PORT, yarn or k8s://https://HOST"
    )


def test_executor_slots_count_each_executors_cores_and_leave_out_the_driver() -> None:
    context = _cluster(lambda: [_executor("driver", 0), _executor("0", 3), _executor("1", 1)])
    assert executor_slots(context, 1) == (4, "2 executor(s)")
    assert executor_slots(context, 2) == (1, "2 executor(s)")  # 3 cores hold one 2-cpu task


def test_without_the_status_store_slots_come_from_executor_cores_or_parallelism() -> None:
    memory = SimpleNamespace(size=lambda: 4)  # three executors and the driver
    jsc = SimpleNamespace(sc=lambda: SimpleNamespace(getExecutorMemoryStatus=lambda: memory))
    context = SimpleNamespace(_jsc=jsc, defaultParallelism=12)
    conf = {"spark.executor.cores": "2"}
    assert executor_slots(context, 1, lambda k, d: conf.get(k, d)) == (
        6,
        "3 executor(s) of spark.executor.cores 2",
    )
    assert executor_slots(context, 2) == (6, "defaultParallelism 12")
    assert executor_slots(SimpleNamespace(), 1) == (0, "Spark reports no executors")


def test_a_cluster_waits_for_executors_to_register_then_refuses_too_few(monkeypatch) -> None:
    monkeypatch.setattr(spark_session, "EXECUTOR_WAIT_SECONDS", 3.0)
    registered: list = [_executor("driver", 0)]

    def late() -> list:  # one executor of 2 cores registers on each look, up to two
        if len(registered) < 3:
            registered.append(_executor(str(len(registered)), 2))
        return list(registered)

    check_master(_config(workers=4), "spark://h:7077", _no_setting, _cluster(late))
    started = time.monotonic()
    small = _cluster(lambda: [_executor("driver", 0), _executor("0", 1)])
    with pytest.raises(ConfigError) as error:
        check_master(_config(workers=2), "spark://h:7077", _no_setting, small)
    assert time.monotonic() - started >= 3.0  # it waited for more before refusing
    assert str(error.value) == (
        "master 'spark://h:7077' runs 1 task(s) at once (1 executor(s), after waiting 3s for"
        " executors to register), but the barrier stage needs one per worker: 2; lower workers"
        " or give the application more executors or cores (spark.executor.instances,"
        " spark.executor.cores, spark.cores.max)"
    )


def test_servers_listen_on_loopback_here_and_where_spark_says_on_a_cluster() -> None:
    conf = {"spark.driver.host": "driver-0.example", "spark.driver.bindAddress": "10.1.2.3"}
    assert placement(_config()) == Placement("127.0.0.1", "127.0.0.1", None)
    assert placement(_config(), True, conf.get) == Placement("10.1.2.3", "driver-0.example")
    only_host = {"spark.driver.host": "10.0.0.9"}
    assert placement(_config(ports="7100-7109"), True, only_host.get) == Placement(
        "0.0.0.0", "10.0.0.9", (7100, 7109)
    )
    explicit = _config(bind_address="198.18.0.2", advertise_address="198.18.0.2")
    assert placement(explicit, True, conf.get) == Placement("198.18.0.2", "198.18.0.2")
    with pytest.raises(ConfigError, match=r"driver\.host is unset; pass --advertise-address"):
        placement(_config(), True, {}.get)


def test_listeners_bound_at_one_address_are_reached_and_advertised_at_others() -> None:
    where = Placement("0.0.0.0", "driver-0.example", (7100, 7103))
    assert where.advertised("tcp://0.0.0.0:7101") == "tcp://driver-0.example:7101"
    assert local_address("tcp://0.0.0.0:7101") == "tcp://127.0.0.1:7101"
    assert local_address("tcp://198.18.0.2:7101") == "tcp://198.18.0.2:7101"
    assert where.candidates() == [7100, 7101, 7102, 7103]
    assert where.candidates(first=3) == [7103, 7100, 7101, 7102]
    assert Placement().candidates(first=3) == [0]


def test_a_listener_takes_the_first_free_port_and_a_full_range_is_named() -> None:
    taken = {7100, 7101}
    tried: list[str] = []

    def open_at(address: str) -> str:
        tried.append(address)
        if port_of(address) in taken:
            raise OSError(errno.EADDRINUSE, "Address already in use")
        return address

    assert bind_first(open_at, "0.0.0.0", [7100, 7101, 7102], "server 0") == "tcp://0.0.0.0:7102"
    assert tried == ["tcp://0.0.0.0:7100", "tcp://0.0.0.0:7101", "tcp://0.0.0.0:7102"]
    with pytest.raises(EmberError) as error:
        bind_first(open_at, "0.0.0.0", [7101, 7100], "server 1")
    assert str(error.value) == (
        "server 1: every port of --ports 7100-7101 on 0.0.0.0 is in use; widen the range or"
        " free some"
    )
    with pytest.raises(OSError, match="Address already in use"):  # a restart keeps its port
        bind_first(open_at, "0.0.0.0", [7100], "server 0")
