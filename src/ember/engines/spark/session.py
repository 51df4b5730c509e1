"""The SparkSession a run trains in: the user's, or a local one started and tuned for ember."""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ember.config import RunConfig, Strategy
from ember.engines.addresses import Placement, placement
from ember.engines.spark import connect
from ember.engines.spark.connect import is_connect
from ember.engines.spark.jvm import (
    LOCAL_DRIVER_MEMORY,
    ClassArchive,
    class_archive,
    java_binary,
    local_driver_options,
)
from ember.errors import ConfigError, EmberError

SESSION_START_TIMEOUT = 300.0  # a JVM that has not started by then is not going to
EXECUTOR_WAIT_SECONDS = 10.0  # how long a cluster's executors may take to register
_CLUSTER = re.compile(r"spark://\S+|yarn|k8s://\S+")
_LOCAL = re.compile(
    r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?|local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,.*\]"
)


def check_supported(config: RunConfig) -> None:
    if config.mode is Strategy.SINGLE:
        raise ConfigError(
            "strategy 'single' is not supported on engine 'spark': it trains one worker alone,"
            " with nothing to exchange, so a Spark cluster adds only its start-up; use"
            " --engine local, or a distributed strategy (bsp, ssp, async, easgd, easgd-async,"
            " allreduce)"
        )
    try:
        import pandas  # noqa: F401 - mapInArrow needs it
        import pyspark  # noqa: F401
    except ImportError:
        raise ConfigError("engine 'spark' needs pyspark: pip install 'ember[spark]'") from None


def check_cluster(config: RunConfig, spark: Any) -> None:
    """Refuse, before any worker starts, what would make the barrier stage wait or fail."""
    if is_connect(spark):
        url, look = connect.master(spark), connect.setting(spark)
        check_master(config, url, look)  # a local master by its URL, a cluster's URL alone
        if not is_local(url):
            connect.configured_slots(config, url, look)
        return
    context = spark.sparkContext
    check_master(config, context.master, context.getConf().get, context)


def master_of(spark: Any) -> str:
    """The master URL of a classic or a Spark Connect session."""
    return connect.master(spark) if is_connect(spark) else str(spark.sparkContext.master)


def is_local(master: str) -> bool:
    """Whether every executor of `master` runs on the driver's machine."""
    return _LOCAL.fullmatch(master) is not None


def check_master(
    config: RunConfig, master: str, setting: Callable[[str, str], Any], context: Any = None
) -> None:
    """check_cluster for a master URL and a lookup of its settings (key, default) -> value.
    A local master's task slots follow from its URL; a cluster's are counted on the running
    `context`'s executors, and not at all before a session exists (context None)."""
    dynamic = str(setting("spark.dynamicAllocation.enabled", "false")).strip().lower() == "true"
    if config.workers_max is not None:  # a range's members are ordinary tasks: any slots do
        return
    if dynamic:
        raise ConfigError(
            "spark.dynamicAllocation.enabled is true, but barrier stages (all workers at once)"
            " do not support dynamic allocation; set it to false"
        )
    task_cpus = max(1, int(setting("spark.task.cpus", "1")))
    match = _LOCAL.fullmatch(master)
    if match is None:
        if context is None and not _CLUSTER.fullmatch(master):
            raise ConfigError(
                f"master {master!r} is not a Spark master URL ember knows: use local[N],"
                " local-cluster[N, CORES, MB], spark://HOST:PORT, yarn or k8s://https://HOST"
            )
        if context is not None:
            _check_executors(config, master, context, task_cpus, setting)
        return
    threads, executors, cores = match.groups()
    if executors is not None:
        slots = int(executors) * int(cores)
    else:
        slots = (os.cpu_count() or 1) if threads == "*" else int(threads or 1)
    slots //= task_cpus
    if slots < config.workers:
        raise ConfigError(
            f"master {master!r} runs {slots} task(s) at once, but the barrier stage needs one"
            f" per worker: {config.workers}; lower workers or use local[{config.workers}]"
        )


def _check_executors(
    config: RunConfig, master: str, context: Any, task_cpus: int, setting: Callable[..., Any]
) -> None:
    """Executors register a moment after the session starts: wait for enough task slots, up
    to EXECUTOR_WAIT_SECONDS, before refusing."""
    deadline = time.monotonic() + EXECUTOR_WAIT_SECONDS
    while True:
        slots, counted = executor_slots(context, task_cpus, setting)
        if slots >= config.workers:
            return
        if time.monotonic() >= deadline:
            raise ConfigError(
                f"master {master!r} runs {slots} task(s) at once ({counted}, after waiting"
                f" {EXECUTOR_WAIT_SECONDS:g}s for executors to register), but the barrier stage"
                f" needs one per worker: {config.workers}; lower workers or give the"
                " application more executors or cores (spark.executor.instances,"
                " spark.executor.cores, spark.cores.max)"
            )
        time.sleep(0.25)


def executor_slots(
    context: Any, task_cpus: int, setting: Callable[..., Any] = lambda _, d: d
) -> tuple[int, str]:
    """The running application's barrier task slots, and how they were counted: each
    executor's cores from Spark's status store (the driver is no executor on a cluster);
    else the executors Spark reports times spark.executor.cores; else defaultParallelism
    (all executors' cores together, but at least 2, or spark.default.parallelism if set)."""
    try:
        executors = context._jsc.sc().statusStore().executorList(True)
        cores = [executors.apply(i) for i in range(executors.size())]
        cores = [int(e.totalCores()) for e in cores if str(e.id()) != "driver"]
        return sum(c // task_cpus for c in cores), f"{len(cores)} executor(s)"
    except Exception:  # an API private to Spark: it may change or be missing
        pass
    per_executor = setting("spark.executor.cores", None)
    try:
        if per_executor is not None:
            executors = int(context._jsc.sc().getExecutorMemoryStatus().size()) - 1
            slots = executors * (int(per_executor) // task_cpus)
            return slots, f"{executors} executor(s) of spark.executor.cores {per_executor}"
    except Exception:
        pass
    try:
        parallelism = int(context.defaultParallelism)
    except Exception:
        return 0, "Spark reports no executors"
    return parallelism // task_cpus, f"defaultParallelism {parallelism}"


def run_placement(config: RunConfig, spark: Any) -> Placement:
    """Where the servers listen and what tasks are told, for the session's master."""
    if is_connect(spark):  # the servers run beside this client, as beside a driver
        look = connect.setting(spark)
        return placement(config, not is_local(connect.master(spark)), look)
    context = spark.sparkContext
    conf = context.getConf()
    return placement(config, not is_local(context.master), lambda key: conf.get(key, None))


def active_session() -> Any:
    """The session of this thread, or the one another thread created; None if none runs."""
    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql import SparkSession

    try:
        return SparkSession.active()
    except PySparkRuntimeError:
        return None


def check_before_start(config: RunConfig) -> None:
    """What can be refused before anything is loaded or started: a master that differs from
    the running session's, no Java for a session of ember's own, too few task slots."""
    active = active_session()
    if active is not None:
        _check_same_master(config, active)
        check_cluster(config, active)
        return
    check_java()
    check_master(config, config.master or f"local[{config.workers}]", lambda _, value: value)
    # a cluster's executors cannot be counted before its session starts: session() does


def _check_same_master(config: RunConfig, active: Any) -> None:
    running = master_of(active)
    if config.master and config.master != running:
        raise ConfigError(
            f"master {config.master!r} differs from the running SparkSession's"
            f" {running!r}; leave master unset to use that session"
        )


def check_java() -> None:
    """A Spark session of ember's own needs a Java runtime: say so before anything starts."""
    if java_binary() is None:
        raise ConfigError(
            "engine 'spark' needs a Java runtime (17 or 21) and found none on PATH or in"
            " JAVA_HOME: install one (e.g. apt-get install openjdk-17-jre-headless)"
        )


@contextmanager
def session(
    config: RunConfig, show_progress: bool, meanwhile: Callable[[], object] | None = None
) -> Iterator[tuple[Any, float]]:
    """The active SparkSession, or one started (and stopped) here for config.master.

    `meanwhile` runs on the calling thread while a JVM starts (or first, when a session is
    running): the driver's own preparation then overlaps the seconds the JVM takes."""
    from pyspark.sql import SparkSession

    active = active_session()
    if active is not None:
        _check_same_master(config, active)
        check_cluster(config, active)
        if meanwhile is not None:
            meanwhile()
        yield active, 0.0
        return
    master = config.master or f"local[{config.workers}]"
    # WARN from the JVM's first line (Spark 3.5+), so its start-up INFO lines stay out too
    builder = SparkSession.builder.master(master).appName("ember").config("spark.log.level", "WARN")
    archive = None
    if master.startswith("local"):  # only here do tasks share the driver's machine and Python
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        archive = _archive_for_a_new_jvm()
        builder = builder.config("spark.driver.extraJavaOptions", local_driver_options(archive))
        builder = builder.config("spark.driver.memory", LOCAL_DRIVER_MEMORY)
    check_java()
    if show_progress:  # Spark's stage bar would fight with ember's
        builder = builder.config("spark.ui.showConsoleProgress", "false")
    starting = _Starting(builder)
    try:
        if meanwhile is not None:
            meanwhile()
        spark, seconds = starting.result(master)
    except BaseException:
        starting.abandon()
        if archive is not None:
            archive.discard()
        raise
    try:
        spark.sparkContext.setLogLevel("FATAL")  # a failed job is reported by ember, once
        check_cluster(config, spark)
        yield spark, seconds
    finally:
        jvm = getattr(spark.sparkContext._gateway, "proc", None)
        _stop_without_waiting(spark)
        if archive is not None and jvm is not None:
            archive.write_after(jvm.pid)


def _archive_for_a_new_jvm() -> ClassArchive | None:
    """The class-data archive, when this session starts a JVM: pyspark keeps the JVM of an
    earlier session in this process, and Java options no longer apply to it."""
    from pyspark import SparkContext

    return class_archive() if SparkContext._gateway is None else None


class _Starting:
    """A SparkSession starting on a thread of its own (pyspark supports that: it then leaves
    SIGINT to the caller), so the caller's thread is free meanwhile."""

    def __init__(self, builder: Any) -> None:
        self._started = time.perf_counter()
        self._outcome: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._start, args=(builder,), daemon=True)
        self._thread.start()

    def _start(self, builder: Any) -> None:
        try:
            self._outcome["spark"] = builder.getOrCreate()
            self._outcome["seconds"] = time.perf_counter() - self._started
        except BaseException as exc:  # handed to the caller's thread in result()
            self._outcome["error"] = exc

    def result(self, master: str) -> tuple[Any, float]:
        self._thread.join(SESSION_START_TIMEOUT)
        if self._thread.is_alive():
            raise EmberError(
                f"Spark did not start with master {master!r} within {SESSION_START_TIMEOUT:g}s"
            )
        if "error" in self._outcome:
            error = self._outcome["error"]
            raise EmberError(f"Spark did not start with master {master!r}: {error}") from error
        return self._outcome["spark"], self._outcome["seconds"]

    def abandon(self) -> None:
        """The caller failed first: stop the session once it is up, so no JVM outlives this."""
        self._thread.join(SESSION_START_TIMEOUT)
        if "spark" in self._outcome:
            _stop_without_waiting(self._outcome["spark"])


def _stop_without_waiting(spark: Any) -> None:
    """SparkSession.stop(), less its wait for pyspark's accumulator server: that thread checks
    for shutdown once a second, which made stopping take most of a second after every run.
    It is told to shut down here and closes its socket in the background."""
    context = spark.sparkContext
    server = getattr(context, "_accumulatorServer", None)
    if server is not None and hasattr(server, "server_shutdown"):
        server.server_shutdown = True  # its handler leaves its poll loop at the next check
        context._accumulatorServer = None
        threading.Thread(target=server.shutdown, name="ember-spark-stop", daemon=True).start()
    spark.stop()


def end_spark(session: Any) -> None:
    """Stop `session` and the JVM behind it: SparkSession.stop() alone leaves the JVM running,
    and a process that must leave no child behind (a test, a benchmark) needs it gone."""
    from pyspark import SparkContext

    session.stop()
    gateway, SparkContext._gateway, SparkContext._jvm = SparkContext._gateway, None, None
    if gateway is not None:
        gateway.shutdown()
        gateway.proc.stdin.close()  # the JVM exits when its stdin closes
        gateway.proc.wait(30)


def stopped(context: Any) -> bool:
    """Whether the SparkContext (or the JVM behind it) is gone."""
    try:
        return bool(context._jsc.sc().isStopped())
    except Exception:  # the JVM no longer answers
        return True


def driver_memory(context: Any) -> str:
    try:
        return str(context.getConf().get("spark.driver.memory", "1g"))
    except Exception:
        return "unknown"
