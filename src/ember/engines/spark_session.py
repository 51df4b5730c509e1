"""The SparkSession a run trains in: the user's, or a local one started and tuned for ember."""

from __future__ import annotations

import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ember.config import RunConfig
from ember.errors import ConfigError, EmberError

# This JVM only hands the data to the tasks, once: the optimizing JIT compiler and the
# parallel collector would spend more CPU than they save (about a second of a run).
_SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
# Locally the data passes through this JVM's heap in several copies (Spark's 1g default
# holds MNIST once, not twice); a ceiling, not a reservation.
_LOCAL_DRIVER_MEMORY = "4g"
_LOCAL = re.compile(
    r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?|local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,.*\]"
)


def check_supported(config: RunConfig) -> None:
    if not config.uses_server:
        raise ConfigError(
            f"strategy {config.strategy!r} is not supported on engine 'spark', which runs a"
            " parameter server beside the driver; use bsp, ssp, async, easgd or easgd-async"
        )
    try:
        import pandas  # noqa: F401 - mapInArrow needs it
        import pyspark  # noqa: F401
    except ImportError:
        raise ConfigError("engine 'spark' needs pyspark: pip install 'ember[spark]'") from None


def check_cluster(config: RunConfig, spark: Any) -> None:
    """Refuse, before any worker starts, what would make the barrier stage wait or fail."""
    try:
        context = spark.sparkContext
    except Exception as exc:  # Spark Connect sessions have no SparkContext
        raise ConfigError(f"engine 'spark' needs a classic SparkSession, not {spark!r}") from exc
    conf, master = context.getConf(), context.master
    if conf.get("spark.dynamicAllocation.enabled", "false").strip().lower() == "true":
        raise ConfigError(
            "spark.dynamicAllocation.enabled is true, but barrier stages (all workers at once)"
            " do not support dynamic allocation; set it to false"
        )
    match = _LOCAL.fullmatch(master)
    if match is None:
        raise ConfigError(
            f"master {master!r} is not local: the parameter servers listen on 127.0.0.1 of the"
            " driver, which executors on other machines cannot reach; use local[N] or"
            " local-cluster[...] (a routable bind address is future work)"
        )
    threads, executors, cores = match.groups()
    if executors is not None:
        slots = int(executors) * int(cores)
    else:
        slots = (os.cpu_count() or 1) if threads == "*" else int(threads or 1)
    slots //= max(1, int(conf.get("spark.task.cpus", "1")))
    if slots < config.workers:
        raise ConfigError(
            f"master {master!r} runs {slots} task(s) at once, but the barrier stage needs one"
            f" per worker: {config.workers}; lower workers or use local[{config.workers}]"
        )


@contextmanager
def session(config: RunConfig, show_progress: bool) -> Iterator[tuple[Any, float]]:
    """The active SparkSession, or one started (and stopped) here for config.master."""
    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql import SparkSession

    try:  # the session of this thread, or the one another thread created
        active = SparkSession.active()
    except PySparkRuntimeError:
        active = None
    if active is not None:
        if config.master and config.master != active.sparkContext.master:
            raise ConfigError(
                f"master {config.master!r} differs from the running SparkSession's"
                f" {active.sparkContext.master!r}; leave master unset to use that session"
            )
        check_cluster(config, active)
        yield active, 0.0
        return
    master = config.master or f"local[{config.workers}]"
    builder = SparkSession.builder.master(master).appName("ember")
    if master.startswith("local"):  # only here do tasks share the driver's machine and Python
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = builder.config("spark.driver.extraJavaOptions", _SHORT_LIVED_JVM)
        builder = builder.config("spark.driver.memory", _LOCAL_DRIVER_MEMORY)
    java = os.path.join(os.environ.get("JAVA_HOME", ""), "bin", "java")
    if not (os.access(java, os.X_OK) or shutil.which("java")):
        raise ConfigError(
            "engine 'spark' needs a Java runtime (17 or 21) and found none on PATH or in"
            " JAVA_HOME: install one (e.g. apt-get install openjdk-17-jre-headless)"
        )
    started = time.perf_counter()
    if show_progress:  # Spark's stage bar would fight with ember's
        builder = builder.config("spark.ui.showConsoleProgress", "false")
    try:
        spark = builder.getOrCreate()
    except Exception as exc:
        raise EmberError(f"Spark did not start with master {master!r}: {exc}") from exc
    try:
        spark.sparkContext.setLogLevel("FATAL")  # a failed job is reported by ember, once
        check_cluster(config, spark)
        yield spark, time.perf_counter() - started
    finally:
        _stop_without_waiting(spark)


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
