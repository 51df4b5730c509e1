"""The Spark engine: one barrier task per worker, parameter servers beside the driver."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np

from ember.config import RunConfig
from ember.data import Dataset
from ember.data.spark import (
    FrameFacts,
    dataframe_dataset,
    frame_from_arrays,
    partition_arrays,
)
from ember.engines.local import merge_server_stats, save_what_the_servers_hold
from ember.engines.process import reap
from ember.engines.progress import Progress
from ember.engines.run import RunResult, RunSetup, finish_run, prepare_run
from ember.engines.servers import ServerGroup
from ember.errors import ConfigError, EmberError, WorkerFailed
from ember.ps import fetch_state
from ember.worker import WorkerSpec, checkpoint_meta, run_worker

EVAL_ROWS = 1000  # test rows shipped to each task for worker 0's per-epoch evaluation
_LOCAL = re.compile(
    r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?|local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,.*\]"
)


def train_spark(config: RunConfig, show_progress: bool = True) -> RunResult:
    """`ember train --engine spark`: load --data on the driver, hand its training split to Spark
    as a DataFrame, and keep the test split on the driver for the final evaluation."""
    _check_supported(config)
    with _session(config, show_progress) as (spark, session_seconds):
        ready = time.perf_counter()
        setup = prepare_run(config)
        data = setup.dataset
        frame = frame_from_arrays(spark, data.x_train, data.y_train, config.workers)
        # load_dataset checked every row already: no Spark job is needed to learn the facts
        width, parts = int(np.prod(data.input_shape)), frame.rdd.getNumPartitions()
        facts = FrameFacts.even(len(data.x_train), parts, width, data.num_classes - 1)
        return _train(setup, spark, frame, facts, (session_seconds, ready), show_progress)


def train_dataframe(
    config: RunConfig,
    df: Any,
    features_col: str = "features",
    label_col: str = "label",
    test_df: Any = None,
    show_progress: bool = False,
) -> RunResult:
    """`ember.spark.fit`: train on a user's DataFrame in its session; the test set (`test_df`,
    or a seeded tenth of `df`) is collected to the driver for the final evaluation."""
    _check_supported(config)
    _check_cluster(config, df.sparkSession)
    ready = time.perf_counter()
    frame, facts, data = dataframe_dataset(df, features_col, label_col, test_df, config.seed)
    setup = _prepare(config, data)
    return _train(setup, df.sparkSession, frame, facts, (0.0, ready), show_progress)


def _task(spec: WorkerSpec, probe: Dataset, batches: Iterator[Any]) -> Iterator[Any]:
    """One worker in a barrier task: its partition as NumPy, then the ordinary worker loop.
    `probe` holds the few test rows worker 0 evaluates on after each epoch."""
    import pyarrow as pa
    from pyspark import BarrierTaskContext

    context = BarrierTaskContext.get()
    world = len(context.getTaskInfos())
    if world != spec.world:
        raise EmberError(f"the barrier stage has {world} tasks for {spec.world} workers")
    x, y = partition_arrays(batches, probe.input_shape)
    # Every worker trains on as many rows as the smallest partition holds, so synchronous
    # strategies take the same number of steps everywhere (as shard_indices does locally).
    rows = min(int(n) for n in context.allGather(str(len(x))))
    data = replace(probe, name="partition", x_train=x[:rows], y_train=y[:rows])
    # Task attempt ids only grow, so a retried stage registers newer incarnations and each
    # worker resumes from the servers' current parameters and its own last pushed step.
    incarnation = int(context.taskAttemptId())
    spec = replace(spec, rank=context.partitionId(), incarnation=incarnation)
    records: list[dict[str, Any]] = []
    records.append(run_worker(spec, records.append, dataset=data))
    lines = [json.dumps({**r, "incarnation": incarnation}) for r in records]
    yield pa.RecordBatch.from_pydict({"record": lines})


def _train(
    setup: RunSetup,
    spark: Any,
    frame: Any,
    facts: FrameFacts,
    clock: tuple[float, float],  # seconds the session took to start, and when it was ready
    show_progress: bool,
) -> RunResult:
    config, data, (session_seconds, ready) = setup.config, setup.dataset, clock
    rows, repartition = facts.rows_per_worker(config.workers, config.batch_size)
    unused = facts.rows - rows * config.workers
    event = {"kind": "run", "event": "partitions", "partitions": len(facts.partition_rows)}
    setup.metrics.write({**event, "repartitioned": repartition, "unused_rows": unused})
    if repartition:
        frame = frame.repartition(config.workers)
    servers = ServerGroup(config, setup.initial, setup.secret, setup.run_dir / "logs", setup.resume)
    job: _Job | None = None
    try:
        spec = WorkerSpec(
            config,
            0,
            config.workers,
            servers.start(),
            setup.secret,
            run_dir=str(setup.run_dir),
            initial_step=setup.resumed_step,
            own_rows=True,
        )
        x_eval, y_eval = data.x_test[:EVAL_ROWS], data.y_test[:EVAL_ROWS]
        probe = replace(data, x_train=x_eval, y_train=y_eval, x_test=x_eval, y_test=y_eval)
        prepared = time.perf_counter()
        task = partial(_task, spec, probe)
        # The shuffle after the barrier stage makes it a map stage, which Spark retries as a
        # whole when a task fails; a failed barrier result stage would end the job instead.
        job = _Job(spark, frame.mapInArrow(task, "record string", barrier=True).repartition(1))
        total = config.epochs * (rows // config.batch_size) * config.batch_size * config.workers
        results = _watch(setup, servers, job, total, show_progress)
        seconds = time.perf_counter() - prepared
        params = servers.snapshot()["params"]
        last = servers.checkpoint(setup.checkpoints, checkpoint_meta(config, params.size, 0))
        timings = {"session": session_seconds, "prepare": prepared - ready, "job": seconds}
        extra = {
            "server": merge_server_stats(servers.stop()),
            "checkpoint": str(last) if last else None,
            "spark": {
                "master": spark.sparkContext.master,
                "stage_attempts": job.attempt() + 1,
                **{f"{name}_seconds": value for name, value in timings.items()},
            },
        }
        return finish_run(setup, params, results, seconds, extra)
    except BaseException:
        if job is not None:
            job.cancel()  # tasks first, so the servers' state is final when it is saved
        if servers.addresses:
            save_what_the_servers_hold(setup, servers)
        raise
    finally:
        reap(servers.processes)


class _Job:
    """The training job on a thread of its own, so the driver can watch servers meanwhile."""

    def __init__(self, spark: Any, frame: Any) -> None:
        self.context = spark.sparkContext
        self.group = f"ember-{uuid.uuid4().hex[:12]}"
        self.rows: list[str] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(frame,), daemon=True)
        self.thread.start()

    def _run(self, frame: Any) -> None:
        self.context.setJobGroup(self.group, "ember training", interruptOnCancel=True)
        try:
            self.rows = [row["record"] for row in frame.collect()]
        except BaseException as exc:
            self.error = exc

    def attempt(self) -> int:
        """The newest attempt of any stage of the job: above 0 once Spark retried a stage."""
        tracker = self.context.statusTracker()
        attempts = [0]
        for job_id in tracker.getJobIdsForGroup(self.group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job else []:
                stage = tracker.getStageInfo(stage_id)
                attempts.append(stage.currentAttemptId if stage else 0)
        return max(attempts)

    def cancel(self) -> None:
        self.context.cancelJobGroup(self.group)
        self.thread.join(30)


def _watch(
    setup: RunSetup, servers: ServerGroup, job: _Job, total: int, show_progress: bool
) -> list[dict[str, Any]]:
    """Checkpoint the servers on schedule and fail fast when one dies, until the job ends."""
    config, metrics = setup.config, setup.metrics
    last_poll = time.monotonic()
    seen_attempt = 0
    with Progress(total, enabled=show_progress) as bar:
        while job.thread.is_alive():
            job.thread.join(0.5)
            servers.keep_alive(setup.checkpoints)
            attempt = job.attempt()
            if attempt > seen_attempt:
                metrics.write({"kind": "run", "event": "stage retry", "attempt": attempt})
                if show_progress:
                    text = f"Spark retries the training stage (attempt {attempt})"
                    bar.bar.write(text, file=sys.stderr)
                seen_attempt = attempt
            if bar.interactive and time.monotonic() - last_poll > 5:
                # Tasks report only when they end; meanwhile the servers know each worker's
                # step (this fetches the parameters too, hence not more often).
                table = fetch_state(servers.primaries, setup.secret, config.request_timeout)[1]
                steps = sum(w["step"] for w in table["workers"].values())
                bar.bar.n, last_poll = min(total, steps * config.batch_size), time.monotonic()
                bar.bar.refresh()
            servers.checkpoint_if_due(
                setup.checkpoints, checkpoint_meta(config, setup.initial.size, 0)
            )
        if job.error is not None:
            error = _python_error(job.error)
            metrics.write({"kind": "failure", "error": error})
            tries = job.attempt() + 1
            raise WorkerFailed(f"the Spark training job failed ({tries} attempt(s)):\n{error}")
        attempt, done = job.attempt(), {}
        for line in job.rows:
            record = {**json.loads(line), "attempt": attempt}
            metrics.write(record)
            bar.update(record)
            if record.get("kind") == "done":
                done[record["rank"]] = record
        bar.bar.n = total  # every worker finished, whatever the replay of the last attempt says
        bar.bar.refresh()
    return [done[rank] for rank in sorted(done)]


def _python_error(exc: BaseException) -> str:
    """The task's Python traceback out of Spark's error, without the JVM stack around it."""
    text = str(exc)
    start = text.find("Traceback (most recent call last)")
    if start < 0:
        return text[:2000]
    ends = [i for i in (text.find("\n\tat ", start), text.find("SQLSTATE", start)) if i > 0]
    return text[start : min(ends, default=len(text))].strip()


def _check_supported(config: RunConfig) -> None:
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


def _check_cluster(config: RunConfig, spark: Any) -> None:
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
def _session(config: RunConfig, show_progress: bool) -> Iterator[tuple[Any, float]]:
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
        _check_cluster(config, active)
        yield active, 0.0
        return
    master = config.master or f"local[{config.workers}]"
    if master.startswith("local"):  # only here do tasks share the driver's machine and Python
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    java = os.path.join(os.environ.get("JAVA_HOME", ""), "bin", "java")
    if not (os.access(java, os.X_OK) or shutil.which("java")):
        raise ConfigError(
            "engine 'spark' needs a Java runtime (17 or 21) and found none on PATH or in"
            " JAVA_HOME: install one (e.g. apt-get install openjdk-17-jre-headless)"
        )
    started = time.perf_counter()
    builder = SparkSession.builder.master(master).appName("ember")
    if show_progress:  # Spark's stage bar would fight with ember's
        builder = builder.config("spark.ui.showConsoleProgress", "false")
    try:
        spark = builder.getOrCreate()
    except Exception as exc:
        raise EmberError(f"Spark did not start with master {master!r}: {exc}") from exc
    try:
        spark.sparkContext.setLogLevel("FATAL")  # a failed job is reported by ember, once
        _check_cluster(config, spark)
        yield spark, time.perf_counter() - started
    finally:
        spark.stop()


def _prepare(config: RunConfig, data: Dataset) -> RunSetup:
    """prepare_run for data already in Spark: the test rows stand in for the dataset."""
    return prepare_run(replace(config, data=data.name), data)


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
