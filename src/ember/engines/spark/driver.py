"""A run on Spark from the driver's side: the data handed over, the training job watched."""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np

from ember.checkpoint import free_step, save_checkpoint
from ember.config.objective import targets_of
from ember.data import Dataset
from ember.data.datasets import check_shards, train_pixels
from ember.data.spark import FrameFacts, dataframe_dataset, frame_from_arrays, frame_from_pixels
from ember.data.streamhost import parquet_files_to_stream
from ember.engines.modelwork import InProcess
from ember.engines.parsed import DataFrameInput, ParsedRun
from ember.engines.progress import Progress
from ember.engines.run import Run
from ember.engines.rundir import RunResult, RunSetup, prepare_run
from ember.engines.spark.connect import is_connect
from ember.engines.spark.jobs import (
    RECORDS,
    Job,
    start_warm_up,
    wait_for_warm_up,
)
from ember.engines.spark.members import (
    ROWS,
    check_member_rows,
    member_job,
    write_array_rows,
    write_frame_rows,
)
from ember.engines.spark.records import RecordCollector
from ember.engines.spark.rendezvous import exposure, state_params
from ember.engines.spark.session import (
    active_session,
    check_before_start,
    check_cluster,
    check_supported,
    is_local,
    master_of,
    run_placement,
    session,
)
from ember.engines.spark.task import train_partition
from ember.engines.spark.watch import SparkWorkers
from ember.engines.userrun import NoModel
from ember.metrics.records import FinalState, RunEvent
from ember.worker.spec import WorkerSpec, checkpoint_meta, load_data

EVAL_ROWS = 1000  # test rows shipped to each task for worker 0's evaluations on the spot


def train_spark(run: ParsedRun) -> RunResult:
    """`ember train --engine spark`: load --data on the driver, hand its training split to Spark
    as a DataFrame, and keep the test split on the driver for the final evaluation. The run's
    `loop` (ember.run) is what the tasks run in place of the built-in loop."""
    config, show_progress, dataset, loop = run.config, run.progress_shown, run.dataset, run.loop
    check_supported(config)
    check_before_start(config)
    check_member_rows(config, dataset, weighted=False)
    streams = dataset is None and loop is None and config.workers_max is None
    files = parquet_files_to_stream(config, print) if streams else []
    if files:  # rows bigger than the driver's share: Spark reads them, the tasks spill them
        with session(config, show_progress) as (spark, _):
            frames = [spark.read.parquet(str(file)) for file in files]
            test = frames[1] if len(frames) > 1 else None
            frame = DataFrameInput(frames[0], test_df=test)
            return train_dataframe(replace(run, frame=frame))
    began = time.perf_counter()
    with Progress(show_progress) as progress:
        progress.phase("loading data")
        # bad data is refused before any JVM starts
        data = dataset if dataset is not None else load_data(config)
        split = (len(data.x_train), len(data.x_test))
        check_shards(data.name, split, config.workers, config.batch_size)
        tried = loop is None or loop.has_data
        work = InProcess(run.objects, tried) if loop is None or loop.has_model else NoModel()
        setup = prepare_run(config, data, work)
        setup.loop, setup.objects = loop, run.objects
        lifecycle = Run(setup, progress)
        # On this machine the servers start (and import PyTorch) while the JVM does; a
        # cluster's addresses come from the session's configuration (spark.driver.host).
        early = active_session() is None and is_local(config.master or "local")

        def meanwhile() -> None:
            if early:
                rows = split[0] // config.workers
                lifecycle.start_servers("starting Spark and the parameter servers", rows)
                progress.phase("waiting for Spark to start")

        with lifecycle, session(config, show_progress, meanwhile) as (spark, session_seconds):
            if not early and lifecycle.servers is not None:
                lifecycle.servers.where = run_placement(config, spark)
                lifecycle.start_servers(rows_per_worker=split[0] // config.workers)
            warm_up = start_warm_up(spark, config.workers)
            if config.workers_max is not None:  # members read the data where they run
                facts = FrameFacts.local(split[0], config.workers, 1, data.num_classes - 1)
                if dataset is not None:  # rows in memory: written where the members read them
                    progress.phase("writing the rows for the members to stream")
                    folder = write_array_rows(dataset, setup.run_dir / ROWS, config.seed)
                    members = (str(folder), "stream")
                else:  # the members stream the files where the driver would not hold them
                    streamed = bool(parquet_files_to_stream(config, progress.note))
                    members = (config.data, "stream" if streamed else "memory")
                clock = (session_seconds, began)
                return _train(lifecycle, spark, None, facts, clock, warm_up, members)
            progress.phase("handing the data to Spark")
            pixels = train_pixels(data)
            if pixels is not None:
                frame = frame_from_pixels(spark, pixels, data.y_train, config.workers)
            else:
                frame = frame_from_arrays(spark, data.x_train, data.y_train, config.workers)
            # load_dataset checked every row already: no Spark job is needed to learn the facts
            rows, width = len(data.x_train), int(np.prod(data.input_shape))
            facts = FrameFacts.local(rows, config.workers, width, data.num_classes - 1)
            if is_connect(spark):  # the server cuts the rows into partitions of its own
                facts = replace(facts, partition_rows=())
            clock = (session_seconds, began)
            return _train(lifecycle, spark, frame, facts, clock, warm_up)


def train_dataframe(run: ParsedRun) -> RunResult:
    """`ember.spark.fit`: train on a user's DataFrame (the run's `frame`) in its session; the
    test set (its `test_df`, or a seeded tenth of its `df`) is collected to the driver for
    the final evaluation."""
    config, given = run.config, run.frame
    if given is None:
        raise ValueError("train_dataframe trains on a DataFrame: the run names none")
    check_member_rows(config, None, weighted=given.weight_col is not None)
    df, features_col, label_col = given.df, given.features_col, given.label_col
    check_supported(config)
    check_cluster(config, df.sparkSession)
    began = time.perf_counter()
    warm_up = start_warm_up(df.sparkSession, config.workers)
    with Progress(run.progress_shown) as progress:
        progress.phase("reading the DataFrame")
        targets = targets_of(config.loss)  # the labels' kind: classes, or values
        frame, facts, data = dataframe_dataset(
            df, features_col, label_col, given.test_df, config.seed, targets, given.weight_col
        )
        with Run(_prepare(run, data), progress) as lifecycle:
            if lifecycle.servers is not None:
                lifecycle.servers.where = run_placement(config, df.sparkSession)
                rows = facts.rows_per_worker(config.workers, config.batch_size)[0]
                lifecycle.start_servers(rows_per_worker=rows)
            if config.workers_max is None:
                return _train(lifecycle, df.sparkSession, frame, facts, (0.0, began), warm_up)
            progress.phase("writing the rows for the members to stream")
            folder = write_frame_rows(frame, data, lifecycle.setup.run_dir / ROWS, config.seed)
            members = (str(folder), "stream")
            return _train(lifecycle, df.sparkSession, None, facts, (0.0, began), warm_up, members)


def _train(
    run: Run,
    spark: Any,
    frame: Any,  # None: a range's members, which read the data themselves
    facts: FrameFacts,
    clock: tuple[float, float],  # seconds the session took to start, and when the run began
    warm_up: Job,
    members: tuple[str, str] | None = None,  # a range's: the data its members read, and how
) -> RunResult:
    setup, config, data, (session_seconds, began) = run.setup, run.config, run.setup.dataset, clock
    rows, repartition = facts.rows_per_worker(config.workers, config.batch_size)
    if frame is not None:  # a barrier stage's partitions; a range's members deal the rows
        repartition = repartition or coalesced(frame)
        unused = facts.rows - rows * config.workers
        partitions = len(facts.partition_rows)
        details = {"partitions": partitions, "repartitioned": repartition, "unused_rows": unused}
        setup.metrics.write(RunEvent(event="partitions", details=details))
        if repartition:
            frame = frame.repartition(config.workers)
    workers: SparkWorkers | None = None
    cluster = not is_local(master_of(spark))
    if run.servers is not None:
        where, slots = run.servers.where, config.servers * config.replicas
    else:  # allreduce: only the record collector listens on the driver
        where, slots = run_placement(config, spark), 0
        warning = exposure(config, cluster)
        if warning is not None:
            print(warning, file=sys.stderr, flush=True)  # always, bar or not
    with run.saving_on_failure(), RecordCollector(setup.secret, where, slots=slots) as collector:
        try:
            spec = WorkerSpec(
                config
                if members is None
                else replace(config, data=members[0], data_mode=members[1]),
                0,
                config.workers,
                run.servers.addresses if run.servers is not None else [],
                setup.secret,
                run_dir=str(setup.run_dir),
                initial_step=setup.resumed_step,
                own_rows=True,
                # allreduce starts from these, on executors that cannot read the driver's files
                initial=setup.initial if setup.resume and run.servers is None else None,
                objects=setup.objects,
                train_fn=setup.loop.fn if setup.loop else None,
                train_args=setup.loop.args if setup.loop else (),
                layout=setup.layout,
            )
            # deferred evaluations cost the loop nothing: they get the whole test set
            shipped = None if config.eval_deferred else EVAL_ROWS
            x_eval, y_eval = data.x_test[:shipped], data.y_test[:shipped]
            probe = replace(data, x_train=x_eval, y_train=y_eval, x_test=x_eval, y_test=y_eval)
            run.progress.phase("warming up executors")
            wait_for_warm_up(warm_up, config.request_timeout)
            prepared = time.perf_counter()
            rows_known = None if repartition else rows
            task = partial(train_partition, spec, probe, rows_known, collector.address, not cluster)
            if frame is None:
                training = member_job(spark, spec, probe, collector.address)
            else:
                # The shuffle after the barrier stage makes it a map stage, which Spark
                # retries as a whole when a task fails; a failed barrier result stage would
                # end the job.
                training = frame.mapInArrow(task, RECORDS, barrier=True).repartition(1)
            run.progress.phase("starting training tasks")
            workers = SparkWorkers(
                spark, lambda: training, collector, config, run.servers, setup.secret
            )
            run.watch(workers, rows)
            state = _final_state(run, workers.states)
            seconds = time.perf_counter() - prepared
            # the session started while the driver prepared: what it added is the rest
            prepare = prepared - began - session_seconds
            timings = {"session": session_seconds, "prepare": prepare, "job": seconds}
            about_spark = {
                "master": master_of(spark),
                "stage_attempts": workers.seen_attempt + 1,
                **where.describe(),
                "record_collector": collector.address,
                **{f"{name}_seconds": value for name, value in timings.items()},
            }
            extra: dict[str, Any] = {"spark": about_spark}
            if run.servers is None:
                assert state is not None  # _watch fails a run without it
                extra["gloo"] = _gloo(cluster, state)
            return run.finish(seconds, extra)
        except BaseException:
            if workers is not None:
                workers.stop()  # tasks first, so the servers' state is final when it is saved
            raise


def coalesced(frame: Any) -> bool:
    """Whether `frame`'s plan coalesces partitions: a barrier stage refuses an RDD whose
    ancestors have another partition count (SPARK-24820), so such a frame is repartitioned,
    as one with too few partitions is. A Spark Connect frame's plan is the server's: False."""
    query = getattr(getattr(frame, "_jdf", None), "queryExecution", None)
    return query is not None and "Coalesce" in query().executedPlan().toString()


def _final_state(run: Run, states: list[FinalState]) -> FinalState | None:
    """Allreduce's rank 0 final state, saved as the run's last checkpoint when it holds the
    parameters (an ember.run loop's only where the run knows its model); None under a
    strategy with servers."""
    if run.servers is not None:
        return None
    if not states:
        run.fail(
            RunEvent(event="no final parameters"),
            "allreduce's rank 0 finished without returning its final parameters",
        )
    if states[0].params is not None:  # ember.run's loop kept its model to itself otherwise
        _save_state(run, states[0])
    return states[0]


def _save_state(run: Run, state: FinalState) -> None:
    """Rank 0's final parameters as the run's last checkpoint, which run.finish evaluates."""
    setup, root = run.setup, run.setup.checkpoints
    params = state_params(state, setup.initial.size)
    step = state.step
    meta = checkpoint_meta(setup.config, setup.layout, step, setup.shape, setup.objects)
    save_checkpoint(
        root, free_step(root, step), {"params": params}, meta, setup.config.keep_checkpoints
    )


def _gloo(cluster: bool, state: FinalState) -> dict[str, Any]:
    """What summary.json says of allreduce's traffic: where rank 0 met the others, and that
    the gradients crossed in clear (gloo has no encryption), off this host on a cluster."""
    return {
        "rendezvous": state.rendezvous,
        "encrypted": False,
        "gradients_left_the_host_unencrypted": cluster,
    }


def _prepare(run: ParsedRun, data: Dataset) -> RunSetup:
    """prepare_run for data already in Spark: the test rows stand in for the dataset."""
    loop = run.loop  # ember.run's, on a DataFrame
    work = InProcess(run.objects) if loop is None or loop.has_model else NoModel()
    setup = prepare_run(replace(run.config, data=data.name), data, work)
    setup.objects, setup.loop = run.objects, loop
    return setup
