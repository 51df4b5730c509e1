"""A run on Spark from the driver's side: the data handed over, the training job watched."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np

from ember.config import RunConfig
from ember.data import Dataset
from ember.data.datasets import train_pixels
from ember.data.spark import (
    FrameFacts,
    dataframe_dataset,
    frame_from_arrays,
    frame_from_pixels,
)
from ember.engines.local import merge_server_stats, save_what_the_servers_hold
from ember.engines.process import reap
from ember.engines.progress import Progress
from ember.engines.run import RunResult, RunSetup, finish_run, prepare_run
from ember.engines.servers import ServerGroup
from ember.engines.spark.jobs import (
    RECORDS,
    Job,
    python_error,
    start_warm_up,
    wait_for_warm_up,
)
from ember.engines.spark.session import (
    check_before_start,
    check_cluster,
    check_supported,
    driver_memory,
    session,
    stopped,
)
from ember.engines.spark.task import train_partition
from ember.errors import WorkerFailed
from ember.ps import fetch_state
from ember.worker import WorkerSpec, checkpoint_meta

EVAL_ROWS = 1000  # test rows shipped to each task for worker 0's per-epoch evaluation


def train_spark(config: RunConfig, show_progress: bool = True) -> RunResult:
    """`ember train --engine spark`: load --data on the driver, hand its training split to Spark
    as a DataFrame, and keep the test split on the driver for the final evaluation."""
    check_supported(config)
    check_before_start(config)
    began = time.perf_counter()
    setup = prepare_run(config)  # bad data is refused before any JVM starts
    data = setup.dataset
    servers = setup.server_group()
    try:
        # the servers start (and import PyTorch) while the JVM does
        with session(config, show_progress, servers.start) as (spark, session_seconds):
            warm_up = start_warm_up(spark, config.workers)
            pixels = train_pixels(data)
            if pixels is not None:
                frame = frame_from_pixels(spark, pixels, data.y_train, config.workers)
            else:
                frame = frame_from_arrays(spark, data.x_train, data.y_train, config.workers)
            # load_dataset checked every row already: no Spark job is needed to learn the facts
            rows, width = len(data.x_train), int(np.prod(data.input_shape))
            facts = FrameFacts.local(rows, config.workers, width, data.num_classes - 1)
            clock = (session_seconds, began)
            return _train(setup, spark, frame, facts, clock, warm_up, show_progress, servers)
    finally:
        reap(servers.processes)


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
    check_supported(config)
    check_cluster(config, df.sparkSession)
    began = time.perf_counter()
    warm_up = start_warm_up(df.sparkSession, config.workers)
    frame, facts, data = dataframe_dataset(df, features_col, label_col, test_df, config.seed)
    setup = _prepare(config, data)
    servers = setup.server_group()
    try:
        servers.start()
        clock = (0.0, began)
        return _train(setup, df.sparkSession, frame, facts, clock, warm_up, show_progress, servers)
    finally:
        reap(servers.processes)


def _train(
    setup: RunSetup,
    spark: Any,
    frame: Any,
    facts: FrameFacts,
    clock: tuple[float, float],  # seconds the session took to start, and when the run began
    warm_up: Job,
    show_progress: bool,
    servers: ServerGroup,  # started; the caller reaps them
) -> RunResult:
    config, data, (session_seconds, began) = setup.config, setup.dataset, clock
    rows, repartition = facts.rows_per_worker(config.workers, config.batch_size)
    unused = facts.rows - rows * config.workers
    event = {"kind": "run", "event": "partitions", "partitions": len(facts.partition_rows)}
    setup.metrics.write({**event, "repartitioned": repartition, "unused_rows": unused})
    if repartition:
        frame = frame.repartition(config.workers)
    job: Job | None = None
    try:
        spec = WorkerSpec(
            config,
            0,
            config.workers,
            servers.addresses,
            setup.secret,
            run_dir=str(setup.run_dir),
            initial_step=setup.resumed_step,
            own_rows=True,
        )
        x_eval, y_eval = data.x_test[:EVAL_ROWS], data.y_test[:EVAL_ROWS]
        probe = replace(data, x_train=x_eval, y_train=y_eval, x_test=x_eval, y_test=y_eval)
        wait_for_warm_up(warm_up, config.request_timeout)
        prepared = time.perf_counter()
        task = partial(train_partition, spec, probe, None if repartition else rows)
        # The shuffle after the barrier stage makes it a map stage, which Spark retries as a
        # whole when a task fails; a failed barrier result stage would end the job instead.
        training = frame.mapInArrow(task, RECORDS, barrier=True).repartition(1)
        job = Job(spark, lambda: training, "ember training")
        total = config.epochs * (rows // config.batch_size) * config.batch_size * config.workers
        results = _watch(setup, servers, job, total, show_progress)
        seconds = time.perf_counter() - prepared
        params = servers.snapshot()["params"]
        last = servers.checkpoint(setup.checkpoints, checkpoint_meta(config, params.size, 0))
        # the session started while the driver prepared: what it added is the rest
        prepare = prepared - began - session_seconds
        timings = {"session": session_seconds, "prepare": prepare, "job": seconds}
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


def _watch(
    setup: RunSetup, servers: ServerGroup, job: Job, total: int, show_progress: bool
) -> list[dict[str, Any]]:
    """Checkpoint the servers on schedule and fail fast when one dies, until the job ends."""
    config, metrics = setup.config, setup.metrics
    last_poll = started = time.monotonic()
    seen_attempt, workers_seen = 0, False
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
            if (bar.interactive or not workers_seen) and time.monotonic() - last_poll > 5:
                # Tasks report only when they end; meanwhile the servers know whether each
                # worker arrived and its step (this fetches the parameters too, hence not
                # more often).
                table = fetch_state(servers.primaries, setup.secret, config.request_timeout)[1]
                workers, last_poll = table["workers"].values(), time.monotonic()
                workers_seen = any(w["incarnation"] >= 0 for w in workers)
                if not workers_seen and last_poll - started > config.request_timeout:
                    job.cancel()
                    raise WorkerFailed(
                        f"no Spark task reached the parameter servers within"
                        f" {config.request_timeout:g} s of the training job's start; see the"
                        " Spark UI or driver log for why its tasks did not run"
                    )
                if bar.interactive:
                    steps = sum(w["step"] for w in workers)
                    bar.bar.n = min(total, steps * config.batch_size)
                    bar.bar.refresh()
            servers.checkpoint_if_due(
                setup.checkpoints, checkpoint_meta(config, setup.initial.size, 0)
            )
        if job.error is not None:
            error = python_error(job.error)
            if stopped(job.context):
                error = (
                    "the SparkContext stopped during training: the driver's JVM exits this way"
                    " when it runs out of memory (raise spark.driver.memory, now"
                    f" {driver_memory(job.context)})\n{error}"
                )
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


def _prepare(config: RunConfig, data: Dataset) -> RunSetup:
    """prepare_run for data already in Spark: the test rows stand in for the dataset."""
    return prepare_run(replace(config, data=data.name), data)
