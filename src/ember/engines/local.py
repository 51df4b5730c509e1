"""The local engine: S server processes and N worker processes on this machine."""

from __future__ import annotations

import dataclasses
import multiprocessing.forkserver
import time
import traceback
from collections.abc import Iterable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import safetensors.numpy

from ember.data.datasets import check_shards
from ember.data.host import host_dataset
from ember.data.store import DataFiles
from ember.data.streamhost import host_run_data
from ember.engines.forking import FORKSERVER, start_forkserver, stop_forkserver
from ember.engines.join import JOIN_FILE, write_join_file
from ember.engines.leave import MEMBERS_FILE, leave_on_sigterm, write_members
from ember.engines.modelwork import Forked
from ember.engines.parsed import ParsedRun
from ember.engines.phases import PeakMemory, Timeline, pids_of
from ember.engines.process import Interpreter, _child_main, free_port, reap, tail
from ember.engines.progress import Progress
from ember.engines.recordpipes import RecordPipes, RecordSender
from ember.engines.run import Run, exit_how
from ember.engines.rundir import RunResult, RunSetup, prepare_run
from ember.engines.servers import spare_servers
from ember.engines.userrun import NoModel
from ember.engines.workers import Exit, Polled
from ember.errors import same_every_time
from ember.metrics import write_json
from ember.metrics.records import Failure, Record, WorkerDone, WorkerError, WorkerStart
from ember.worker.spec import WorkerSpec


def train_local(run: ParsedRun) -> RunResult:
    """Run servers and workers as children of this process; every child is reaped on return,
    error or Ctrl-C, and a failure saves what the servers hold before they stop. The run's
    `dataset`, arrays the caller holds, is trained on in place of config.data; its `loop`
    (ember.run) is what the workers run in place of the built-in loop."""
    config, dataset, loop = run.config, run.dataset, run.loop
    timeline, memory = Timeline(), PeakMemory()
    start_forkserver()  # running already when `ember train` started it (engines/__init__.py)
    spares: list[Interpreter] = []
    try:
        spares += spare_servers(config)  # their imports run while the fork server imports torch
        with Progress(run.progress_shown) as progress:
            progress.phase("loading data")
            timeline.mark("data")
            if dataset is not None:
                host = host_dataset(dataset)
            else:  # laid out to map, or planned to stream (--data-mode)
                host = host_run_data(config, progress.note)
            try:
                files = host.files
                rows = (files.train_rows, files.test_rows)
                check_shards(files.name, rows, config.workers, config.batch_size)
                progress.phase("importing torch, building the model")
                timeline.mark("model")
                model = loop is None or loop.has_model
                tried = loop is None or loop.has_data
                work = Forked(host.files, run.objects, memory, tried) if model else NoModel()
                setup = prepare_run(config, host.files.dataset(), work)
                setup.loop, setup.objects = loop, run.objects
                setup.spare_servers = spares
                result = _train(setup, progress, (timeline, memory), host.files)
            finally:
                host.close()
    finally:
        reap(spares)  # those the servers' start did not take
        stop_forkserver()
    # summary.json once more, now that the teardown's seconds are known
    result.summary.update(timeline.summary(), peak_memory_bytes=memory.total())
    write_json(result.run_dir / "summary.json", result.summary)
    return result


def _train(
    setup: RunSetup, progress: Progress, clocks: tuple[Timeline, PeakMemory], files: DataFiles
) -> RunResult:
    config, (timeline, memory) = setup.config, clocks
    workers: LocalWorkers | None = None
    pipes = RecordPipes(config.workers, lambda: FORKSERVER.Pipe(duplex=False))
    with Run(setup, progress, timeline, memory) as run, run.saving_on_failure():
        try:
            rows = files.train_rows // config.workers
            addresses = run.start_servers(rows_per_worker=rows)
            if config.joinable:
                write_join_file(setup.run_dir, config, addresses, setup.secret)
            started = time.perf_counter()
            initial_file = None
            if not config.uses_server and setup.resume is not None:  # small spawn arguments
                initial_file = str(setup.run_dir / "logs" / "start-state.safetensors")
                safetensors.numpy.save_file({"params": setup.initial}, initial_file)
            base = WorkerSpec(
                config,
                0,
                config.workers,
                addresses,
                setup.secret,
                f"tcp://127.0.0.1:{free_port()}",
                str(setup.run_dir),
                initial_file=initial_file,
                initial_step=setup.resumed_step,
                own_rows=True,  # each is handed its shard alone
                objects=setup.objects,
                train_fn=setup.loop.fn if setup.loop else None,
                train_args=setup.loop.args if setup.loop else (),
                layout=setup.layout,
            )
            progress.phase("starting workers")
            timeline.mark("workers")
            workers = LocalWorkers(base, pipes, files)
            restarts = run.watch(workers, rows)
            seconds = time.perf_counter() - started
            return run.finish(seconds, {"worker_restarts": restarts})
        finally:
            # the workers go before the run ends: the servers' state is final when saved
            (setup.run_dir / JOIN_FILE).unlink(missing_ok=True)  # no longer joinable
            (setup.run_dir / MEMBERS_FILE).unlink(missing_ok=True)
            if workers is not None:
                workers.stop()
            pipes.close_all()


class LocalWorkers:
    """The local engine's workers for the Run's watch loop: a process each, started by the
    fork server, whose records come through a pipe each (RecordPipes)."""

    restarts_ranks = True  # a dead rank is started again; the others go on

    def __init__(self, base: WorkerSpec, pipes: RecordPipes, files: DataFiles) -> None:
        self.base, self.pipes, self.files = base, pipes, files
        self.processes: list[Any] = []
        self.finished: set[int] = set()  # ranks whose "done" record came
        self.failed: set[int] = set()  # ranks that said they failed, not yet restarted
        self._said: dict[int, int] | None = None  # the pids members.json names

    def start(self) -> None:
        for rank in range(self.base.world):
            self.processes.append(self._launch(dataclasses.replace(self.base, rank=rank)))
        self._say_members()

    def running(self) -> bool:
        return len(self.finished) < len(self.processes)

    def poll(self, timeout: float) -> Polled:
        polled = Polled()
        self._take(self.pipes.wait(timeout), polled)
        for rank, process in enumerate(self.processes):
            if self._unaccounted(rank) and process.exitcode is not None:
                self._take(self.pipes.read(rank), polled)  # its last words, to the pipe's end
                if self._unaccounted(rank):
                    polled.exits.append(Exit(rank, process.exitcode, ""))
        self.failed.clear()
        self._say_members()
        return polled

    def restart(self, rank: int, incarnation: int) -> None:
        reap([self.processes[rank]])
        spec = dataclasses.replace(self.base, rank=rank, incarnation=incarnation)
        self.processes[rank] = self._launch(spec)
        self._say_members()

    def _say_members(self) -> None:
        """A worker range's run names its running workers' pids for `ember leave`
        (leave.py): rewritten when one starts, is restarted or is gone."""
        if self.base.config.workers_max is None:
            return
        pids = {rank: pid for rank, pid in enumerate(pids_of(self.processes)) if pid is not None}
        if pids != self._said:
            write_members(Path(self.base.run_dir), pids)
            self._said = pids

    def failure(self, exit: Exit, why: str) -> tuple[Record, str]:
        log = Path(self.base.run_dir) / "logs" / f"worker-{exit.rank}.log"
        how = f"{exit_how(exit.exitcode)} ({why})" if why else exit_how(exit.exitcode)
        # the traceback is in the log too (_work prints it there): said once, with the log's
        # tail, long enough for a traceback through a model's forward and what was printed
        last = tail(log, TAIL_LINES)
        error = exit.error
        said = error.split("\n" + TRACEBACK)[0].strip() if TRACEBACK in last else error.strip()
        record = Failure(rank=exit.rank, exitcode=exit.exitcode, error=error)
        text = f"{said or '(no traceback)'}\n--- last lines of {log} ---\n{last}"
        return record, f"worker {exit.rank} {how}:\n{text}"

    def pids(self) -> list[int | None]:
        """The workers' pids and the fork server's, whose memory is the run's too."""
        server = getattr(multiprocessing.forkserver, "_forkserver", None)
        return [*pids_of(self.processes), getattr(server, "_forkserver_pid", None)]

    def stop(self) -> None:
        reap(self.processes)

    def _unaccounted(self, rank: int) -> bool:
        return rank not in self.finished and rank not in self.failed

    def _take(self, received: Iterable[tuple[int, Record]], polled: Polled) -> None:
        """Records as they came (a pipe carries its current process's alone); a worker's
        error record is its exit, final when it says a restart would repeat it."""
        for rank, record in received:
            if isinstance(record, WorkerError):
                self.failed.add(rank)
                polled.exits.append(Exit(rank, None, record.error, not record.retry))
            elif isinstance(record, WorkerDone):
                self.finished.add(rank)
            polled.records.append(record)

    def _launch(self, spec: WorkerSpec) -> Any:
        log = Path(spec.run_dir) / "logs" / f"worker-{spec.rank}.log"
        pipe = self.pipes.open(spec.rank)
        process = FORKSERVER.Process(
            target=_child_main,
            args=(_work, (spec, pipe, self.files), str(log)),
            name=f"ember-worker-{spec.rank}",
            daemon=False,
        )
        try:
            process.start()
        finally:
            pipe.close()  # the worker has its own end: the pipe ends when the worker does
        return process


TRACEBACK = "Traceback (most recent call last):"
TAIL_LINES = 30


def _work(spec: WorkerSpec, pipe: Connection, files: DataFiles) -> None:
    from ember.worker.loop import run_worker  # the fork server's, imported already

    records, started = RecordSender(pipe), False

    def report(record: Record) -> None:
        nonlocal started
        started = started or isinstance(record, WorkerStart)
        records.send(record)

    try:
        # mapped read-only: its rows only, or a range member the whole set, dealt in pieces
        dataset = files.shard(*((0, 1) if spec.dealt else (spec.rank, spec.world)))
        # a range's member leaves on SIGTERM (`ember leave`); a fixed run's dies of it
        stop = leave_on_sigterm() if spec.config.workers_max is not None else None
        records.send(run_worker(spec, report, dataset, stop))
    except BaseException as exc:
        text = traceback.format_exc()
        print(text, flush=True)
        error = f"{type(exc).__name__}: {exc}\n{text}"
        retry = not same_every_time(exc, started)
        record = WorkerError(rank=spec.rank, incarnation=spec.incarnation, error=error, retry=retry)
        records.send_last(record)
        raise SystemExit(1) from None


__all__ = ["train_local"]
