"""The body of a training task: one worker in a barrier task, on its partition's rows."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from ember.data import Dataset
from ember.data.spark import partition_arrays
from ember.engines.spark.records import RecordSender
from ember.errors import EmberError
from ember.wire import use_encryption
from ember.worker import WorkerSpec, run_worker


def train_partition(
    spec: WorkerSpec,
    probe: Dataset,
    rows: int | None,
    collector: str | None,
    batches: Iterator[Any],
) -> Iterator[Any]:
    """One worker in a barrier task: its partition as NumPy, then the ordinary worker loop.
    `probe` holds the few test rows worker 0 evaluates on after each epoch; `rows` is how
    many rows each worker trains on, when the driver knows every partition's size. Records
    also stream to the driver's `collector` (an address) while the task runs."""
    import pyarrow as pa
    from pyspark import BarrierTaskContext

    context = BarrierTaskContext.get()
    world = len(context.getTaskInfos())
    if world != spec.world:
        raise EmberError(f"the barrier stage has {world} tasks for {spec.world} workers")
    x, y = partition_arrays(batches, probe.input_shape)
    # Every worker trains on as many rows as the smallest partition holds, so synchronous
    # strategies take the same number of steps everywhere (as shard_indices does locally).
    # After a repartition only the tasks know their sizes; allGather costs about a second.
    if rows is None:
        rows = min(int(n) for n in context.allGather(str(len(x))))
    elif len(x) < rows:
        raise EmberError(f"partition {context.partitionId()} holds {len(x)} rows, not {rows}")
    data = replace(probe, name="partition", x_train=x[:rows], y_train=y[:rows])
    # Task attempt ids only grow, so a retried stage registers newer incarnations and each
    # worker resumes from the servers' current parameters and its own last pushed step.
    incarnation = int(context.taskAttemptId())
    spec = replace(spec, rank=context.partitionId(), incarnation=incarnation)
    records: list[dict[str, Any]] = []
    use_encryption(spec.config.encrypt)  # before the record sender's thread connects
    sender = RecordSender(collector, spec.secret) if collector is not None else None

    def report(record: dict[str, Any]) -> None:
        records.append(record)
        if sender is not None:
            sender.send({**record, "incarnation": incarnation})

    try:
        report(run_worker(spec, report, dataset=data))
    finally:
        if sender is not None:
            sender.close()
    lines = [json.dumps({**r, "incarnation": incarnation}) for r in records]
    yield pa.RecordBatch.from_pydict({"record": lines})
