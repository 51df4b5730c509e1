"""A worker range's run on Spark: not a barrier stage but one job of MAX ordinary tasks, each
a member that trains the rows the servers deal (ps/pieces.py) until none is left.

Spark starts a task when a slot is free, so an executor that dynamic allocation adds (or a
worker host that joins a standalone cluster) starts the next pending member; a task that
fails (its executor lost, decommissioned or killed) is retried alone, up to
spark.task.maxFailures, and its retry registers as a newer incarnation, which hands the
dead one's pieces to whoever asks next. The survivors never stop. Each member reads the
run's data by name where its executor runs (a path every host sees, or a dataset ember
knows), so no rows travel through Spark.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from typing import Any

from ember.config import RunConfig
from ember.data import Dataset
from ember.engines.spark.task import TaskRecords, assigned_gpus, probe_servers
from ember.errors import ConfigError
from ember.metrics.records import Unreachable
from ember.wire import use_encryption
from ember.worker.spec import WorkerSpec, load_data

RECORDS = "record string"


def member_job(spark: Any, spec: WorkerSpec, probe: Dataset, collector: str) -> Any:
    """The training job of a range's run: MAX one-row partitions, a member each."""
    members = spec.config.workers_max or spec.config.workers
    task = partial(train_member, spec, probe, collector)
    return spark.range(0, members, numPartitions=members).mapInArrow(task, RECORDS)


def check_member_data(config: RunConfig, has_arrays: bool) -> None:
    """A range's members read the data by name: rows handed over in memory (arrays, a
    DataFrame) train in a fixed-size barrier stage."""
    if config.workers_max is not None and has_arrays:
        raise ConfigError(
            f"a worker range ({config.workers}:{config.workers_max}) on Spark reads --data by"
            " name or path on each executor; rows handed over as arrays or a DataFrame train"
            " in a fixed-size barrier stage: give workers=N"
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
    loaded = load_data(spec.parts)
    data = replace(loaded, x_test=probe.x_test, y_test=probe.y_test)
    spec = replace(spec, rank=rank, incarnation=incarnation, gpus=assigned_gpus(context))
    records = TaskRecords(collector, spec.secret, rank, incarnation)
    from ember.worker.loop import run_worker  # torch: only in the task

    with records.running():  # Spark retries this task alone; the others go on
        records.report(run_worker(spec, records.report, dataset=data))
    yield records.batch()
