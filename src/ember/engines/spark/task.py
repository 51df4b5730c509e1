"""The body of a training task: one worker in a barrier task, on its partition's rows."""

from __future__ import annotations

import json
import math
import socket
import traceback
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from ember.algorithms.allreduce import settled
from ember.config.devices import GPU_RESOURCE
from ember.data import Dataset
from ember.data.spill import Partition, partition_data
from ember.engines.spark.gather import Ready, all_gather
from ember.engines.spark.records import RecordSender
from ember.engines.spark.rendezvous import (
    Meeting,
    connect,
    final_state,
    gloo_interface,
    meet,
    own_address,
    reach,
    scratch,
)
from ember.errors import EmberError, same_every_time
from ember.metrics.records import (
    FinalState,
    Note,
    Record,
    Returned,
    Unreachable,
    WorkerError,
    WorkerStart,
)
from ember.wire import CONNECTION_ERRORS, ClientConnection, use_encryption
from ember.worker.loop import Report, run_worker
from ember.worker.spec import WorkerSpec

PROBE_SECONDS = 5.0  # a server this task cannot reach within this is not going to answer


def train_partition(
    spec: WorkerSpec,
    probe: Dataset,
    rows: int | None,
    collector: str | None,
    local: bool,
    batches: Iterator[Any],
) -> Iterator[Any]:
    """One worker in a barrier task: its partition as NumPy (or spilled to the executor's
    disk, --data-mode stream), then the ordinary worker loop. `probe` holds the test rows
    worker 0 evaluates on (a few, or all if deferred); `rows` is how many rows each worker
    trains on, when the driver knows every partition's size. Records also stream to the
    driver's `collector` (an address) while the task runs. `local`: every executor is on the
    driver's machine (a local master), where allreduce meets on loopback."""
    from pyspark import BarrierTaskContext

    context = BarrierTaskContext.get()
    world = len(context.getTaskInfos())
    if world != spec.world:
        raise EmberError(f"the barrier stage has {world} tasks for {spec.world} workers")
    servers = spec.parts.servers
    # before the probe's and the record sender's sockets
    use_encryption(servers.encrypt, servers.wire_cipher)
    # a spill is removed when the task ends, however it ends
    with partition_data(batches, probe, spec.parts.data, rows) as partition:
        yield from _train(context, spec, probe, rows, collector, local, partition)


def _train(
    context: Any,
    spec: WorkerSpec,
    probe: Dataset,
    rows: int | None,
    collector: str | None,
    local: bool,
    partition: Partition,
) -> Iterator[Any]:
    import pyarrow as pa

    rank = context.partitionId()
    # allreduce has no server: rank 0 opens the rendezvous, and the others probe it instead
    parts = spec.parts
    meeting = None
    if not parts.strategy.uses_server:
        meeting = meet(context, parts.engine.ports, parts.servers.request_timeout, local)
    # Each task connects to every server before its first step and all hear every verdict
    # (allGather costs about a second): when one cannot, every task returns that one line
    # and the stage ends once. Raising instead would have Spark retry the stage, up to
    # spark.stage.maxConsecutiveAttempts times, to the same end.
    failed = reach(meeting, rank) if meeting else probe_servers(spec.servers, spec.secret)
    verdicts: list[Ready] = all_gather(context, Ready(partition.rows, failed))
    failures = [v.unreachable for v in verdicts if v.unreachable]
    if failures:
        unreachable = Unreachable(rank=rank, error=failures[0]).to_json()
        yield pa.RecordBatch.from_pydict({"record": [json.dumps(unreachable)]})
        return
    # Every worker trains on as many rows as the smallest partition holds, so synchronous
    # strategies take the same number of steps everywhere (as shard_indices does locally).
    # After a repartition only the tasks know their sizes.
    if rows is None:
        rows = min(v.rows for v in verdicts)
    elif partition.rows < rows:
        raise EmberError(f"partition {rank} holds {partition.rows} rows, not {rows}")
    data = partition.dataset(probe, rows)
    # Task attempt ids only grow, so a retried stage registers newer incarnations and each
    # worker resumes from the servers' current parameters and its own last pushed step
    # (allreduce, which has no server, starts again from the run's starting parameters).
    incarnation = int(context.taskAttemptId())
    spec = replace(spec, rank=rank, incarnation=incarnation, gpus=assigned_gpus(context))
    records = TaskRecords(collector, spec.secret, rank, incarnation)
    report = records.report
    if partition.said:
        report(Note(rank=rank, text=partition.said))
    with records.running():  # Spark retries the stage, which resumes from the servers
        if meeting is None:
            report(run_worker(spec, report, dataset=data))
        else:
            states = _all_reduce(context, spec, meeting, data, report)
            records.kept.extend(replace(state, incarnation=incarnation) for state in states)
    yield records.batch()


class TaskRecords:
    """A training task's records: each streamed to the driver's collector as it comes (where
    there is one), all kept to return as the task's rows at its end."""

    def __init__(self, collector: str | None, secret: bytes, rank: int, incarnation: int):
        self.rank, self.incarnation = rank, incarnation
        self.kept: list[Record] = []
        self.sender = RecordSender(collector, secret) if collector is not None else None
        self.started = False

    def report(self, record: Record) -> None:
        self.started = self.started or isinstance(record, WorkerStart)
        record = replace(record, incarnation=self.incarnation)  # which attempt sent it
        self.kept.append(record)
        if self.sender is not None and not isinstance(record, Returned):  # rows carry it, once
            self.sender.send(record.to_json())

    @contextmanager
    def running(self) -> Iterator[None]:
        """Around the worker: an error a retry would repeat becomes a WorkerError record
        (raised, Spark would run every attempt to this same end; as a record the driver ends
        the job on it at once); any other is raised for Spark to retry."""
        try:
            yield
        except Exception as exc:
            if not same_every_time(exc, self.started):
                raise
            traceback.print_exc()  # the whole of it in the executor's log
            cause = f"worker {self.rank} on {socket.gethostname()}: {type(exc).__name__}: {exc}"
            rank, incarnation = self.rank, self.incarnation
            self.report(WorkerError(rank=rank, incarnation=incarnation, error=cause, retry=False))
        finally:
            if self.sender is not None:
                self.sender.close()

    def batch(self) -> Any:
        """The records as the task's one Arrow batch of rows."""
        import pyarrow as pa

        lines = [json.dumps(record.to_json()) for record in self.kept]
        return pa.RecordBatch.from_pydict({"record": lines})


def _all_reduce(
    context: Any, spec: WorkerSpec, meeting: Meeting, data: Dataset, report: Report
) -> list[FinalState]:
    """run_worker for allreduce in the process group `meeting` opens; rank 0's final state as
    a record. Its worker saves on the executor only at the end, in a folder of the task's."""
    import torch.distributed as dist

    config = replace(spec.config, checkpoint_seconds=math.inf, checkpoint_steps=0)
    with scratch() as folder, gloo_interface(meeting):
        try:
            connect(meeting, spec.parts.servers.request_timeout, spec.world)
            rendezvous = f"tcp://{meeting.address}"  # torchrun's MASTER_ADDR and MASTER_PORT
            spec = replace(
                spec, config=config, store=meeting.store, rendezvous=rendezvous, run_dir=folder
            )
            report(run_worker(spec, report, dataset=data))
            # rank 0's store serves the group until every rank has left it
            context.barrier()
        finally:
            if dist.is_initialized():  # a failed step: the reused Python worker starts clean
                settled(dist.destroy_process_group)()
            meeting.store = None
        if spec.rank != 0:
            return []
        if spec.train_fn is not None and not (Path(folder) / "checkpoints").is_dir():
            return [FinalState(rendezvous=meeting.address)]  # the loop kept its model
        return [final_state(folder, meeting)]


def assigned_gpus(context: Any) -> tuple[str, ...]:
    """The GPU addresses Spark assigned this task (spark.task.resource.gpu.amount on a cluster
    whose workers discover GPUs); none where it schedules none."""
    resource = context.resources().get(GPU_RESOURCE)
    return tuple(resource.addresses) if resource is not None else ()


def probe_servers(servers: list[str], secret: bytes, seconds: float = PROBE_SECONDS) -> str | None:
    """Connect to every server (each shard's replicas too), all at once: None when each
    answers as a server of this run within `seconds`, else the one line saying which did
    not, from where and what to check."""
    addresses = [a for shard in servers for a in shard.split(",")]
    with ThreadPoolExecutor(len(addresses)) as pool:
        failures = list(pool.map(lambda a: _probe(a, secret, seconds), addresses))
    return next((f for f in failures if f is not None), None)


def _probe(address: str, secret: bytes, seconds: float) -> str | None:
    """None when `address` answers as a server of this run; else the one line saying why."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    try:  # a bare TCP connection first: it tells a refusal from silence, and fast
        socket.create_connection((host, int(port)), timeout=seconds).close()
        ClientConnection(address, secret, timeout=seconds).close()
        return None
    except (OSError, *CONNECTION_ERRORS) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        if isinstance(exc, TimeoutError | socket.timeout):
            reason = f"no answer within {seconds:g}s"
    return (
        f"the training task on {socket.gethostname()} ({own_address(host, int(port))}) cannot"
        f" reach the parameter server at {host} port {port}: {reason}. Check --advertise-address"
        " (what tasks are told the driver is at), that no firewall between this host and the"
        " driver drops the port, and --ports"
    )
