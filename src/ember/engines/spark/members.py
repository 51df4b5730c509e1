"""A worker range's run on Spark: not a barrier stage but one job of MAX ordinary tasks, each
a member that trains the rows the servers deal (ps/pieces.py) until none is left.

Spark starts a task when a slot is free, so an executor that dynamic allocation adds (or a
worker host that joins a standalone cluster) starts the next pending member; a task that
fails (its executor lost, decommissioned or killed) is retried alone, up to
spark.task.maxFailures, and its retry registers as a newer incarnation, which hands the
dead one's pieces to whoever asks next. The survivors never stop. Each member reads the
run's data by name where its executor runs (a path every host sees, or a dataset ember
knows), so no rows travel through Spark. Rows handed over in memory (arrays, a DataFrame)
are written once as Parquet under the run's directory (ROWS), which every executor must
then see; a member streams the Parquet files it reads piece by piece as they are dealt,
holding none of the rest.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ember.config import RunConfig, RunParts
from ember.config.objective import targets_of
from ember.data import Dataset
from ember.data.stream import WINDOW_BYTES
from ember.data.streamhost import StreamedDataset, no_targets, training_plan
from ember.engines.spark.task import TaskRecords, assigned_gpus, probe_servers
from ember.errors import ConfigError
from ember.metrics.records import Unreachable
from ember.wire import use_encryption
from ember.worker.spec import WorkerSpec, load_data

RECORDS = "record string"
ROWS = "rows"  # under the run's directory: a range's rows handed over in memory, as Parquet


def member_job(spark: Any, spec: WorkerSpec, probe: Dataset, collector: str) -> Any:
    """The training job of a range's run: MAX one-row partitions, a member each."""
    members = spec.config.workers_max or spec.config.workers
    task = partial(train_member, spec, probe, collector)
    return spark.range(0, members, numPartitions=members).mapInArrow(task, RECORDS)


def check_member_rows(config: RunConfig, data: Dataset | None, weighted: bool) -> None:
    """What a range's members cannot stream from Parquet: weighted rows, and inputs of
    several named arrays; each is one error with the way out."""
    if config.workers_max is None:
        return
    span = f"a worker range ({config.workers}:{config.workers_max}) on Spark"
    if weighted or (data is not None and data.w_train is not None):
        raise ConfigError(f"{span} streams its rows without weights: give workers=N to weigh them")
    if data is not None and data.x_train.dtype.names is not None:
        raise ConfigError(
            f"{span} streams one features array a row, not several named inputs: give workers=N"
        )


def write_array_rows(data: Dataset, folder: Path, seed: int) -> Path:
    """The training rows of `data` (arrays on the driver) as train.parquet in `folder`, in
    an order the seed fixes, and its test rows as test.parquet beside them."""
    # A piece is a stretch of the file: rows sorted by label would make each a class or two.
    order = np.random.default_rng([seed, 0x0DE7]).permutation(len(data.y_train))
    _write_rows(folder / "train.parquet", data.x_train[order], data.y_train[order])
    _write_rows(folder / "test.parquet", data.x_test, data.y_test)
    return folder


def write_frame_rows(frame: Any, test: Dataset, folder: Path, seed: int) -> Path:
    """A checked training frame's rows (features, label) as train.parquet in `folder`, a
    folder of Parquet files Spark writes in row groups of about WINDOW_BYTES, in an order
    the seed fixes; the test rows the driver holds as test.parquet beside it."""
    from pyspark.sql import functions as F

    _write_rows(folder / "test.parquet", test.x_test, test.y_test)
    # A piece is a stretch of a file, and randomSplit (the held-out tenth) sorts each
    # partition by its values: unshuffled, a piece held a few classes (0.78 of a fixed
    # run's accuracy on digits). Once, a sort on a random key.
    rows = frame.select("features", "label").orderBy(F.rand(seed))
    rows.write.option("parquet.block.size", WINDOW_BYTES).parquet(str(folder / "train.parquet"))
    return folder


def _write_rows(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    """Rows as a Parquet file of `features` (each row's values, flat) and `label`, in row
    groups of about WINDOW_BYTES: the pieces a member reads when one is dealt."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(len(x), -1)
    width = flat.shape[1]
    features = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), width)
    labels = pa.array(list(y.reshape(len(y), -1)) if y.ndim > 1 else y)
    table = pa.table({"features": features, "label": labels})
    pq.write_table(table, path, row_group_size=max(1, WINDOW_BYTES // (4 * width)))


def member_data(parts: RunParts, probe: Dataset) -> Dataset:
    """The rows a member trains, its held-out rows `probe`'s: the run's data loaded here,
    or, where the driver said it streams (data_mode stream), a plan of its training files,
    read a piece at a time as the servers deal it."""
    if parts.data.data_mode != "stream":
        loaded = load_data(parts)
        return replace(loaded, x_test=probe.x_test, y_test=probe.y_test)
    plan = training_plan(parts.data.data, targets_of(parts.training.loss))
    return StreamedDataset(
        probe.name,
        np.empty((0, *probe.input_shape), dtype=np.float32),
        no_targets(plan),
        probe.x_test,
        probe.y_test,
        probe.num_classes,
        probe.input_shape,
        plan=plan,
    )


def train_member(
    spec: WorkerSpec, probe: Dataset, collector: str, batches: Iterator[Any]
) -> Iterator[Any]:
    """One member in an ordinary task: the run's data loaded here, its held-out rows
    `probe`'s, then the worker loop until the servers have dealt every row."""
    import pyarrow as pa
    from pyspark import TaskContext

    for _ in batches:  # its one row says nothing the partition id does not
        pass
    context = TaskContext.get()
    assert context is not None, "a member runs in a Spark task"
    rank, incarnation = context.partitionId(), int(context.taskAttemptId())
    servers = spec.parts.servers
    use_encryption(servers.encrypt, servers.wire_cipher)
    unreachable = probe_servers(spec.servers, spec.secret)
    if unreachable is not None:  # the retries would find the same: said once, it ends the job
        record = Unreachable(rank=rank, error=unreachable).to_json()
        yield pa.RecordBatch.from_pydict({"record": [json.dumps(record)]})
        return
    data = member_data(spec.parts, probe)
    spec = replace(spec, rank=rank, incarnation=incarnation, gpus=assigned_gpus(context))
    records = TaskRecords(collector, spec.secret, rank, incarnation)
    from ember.worker.loop import run_worker  # torch: only in the task

    with records.running():  # Spark retries this task alone; the others go on
        records.report(run_worker(spec, records.report, dataset=data))
    yield records.batch()
