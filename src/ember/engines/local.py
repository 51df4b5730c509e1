"""The local engine: S server processes and N worker processes on this machine."""

from __future__ import annotations

import dataclasses
import multiprocessing.forkserver
import time
import traceback
from collections.abc import Iterable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NoReturn

import safetensors.numpy

from ember.config import RunConfig
from ember.data.datasets import Dataset, check_shards
from ember.data.host import host_dataset
from ember.data.store import DataFiles
from ember.data.streamhost import host_run_data
from ember.engines.forking import FORKSERVER, start_forkserver, stop_forkserver
from ember.engines.join import JOIN_FILE, write_join_file
from ember.engines.modelwork import Forked
from ember.engines.phases import PeakMemory, Timeline, pids_of
from ember.engines.process import Interpreter, _child_main, free_port, reap, tail
from ember.engines.progress import Progress
from ember.engines.recordpipes import RecordPipes, RecordSender
from ember.engines.run import Run
from ember.engines.rundir import RunResult, RunSetup, prepare_run
from ember.engines.servers import spare_servers
from ember.engines.userrun import NoModel
from ember.errors import same_every_time
from ember.metrics import WorkerError, WorkerFailure, WorkerRestart, write_json
from ember.spec import UserLoop, WorkerSpec, model_object, user_functions


def train_local(
    config: RunConfig,
    show_progress: bool = True,
    dataset: Dataset | None = None,
    loop: UserLoop | None = None,
) -> RunResult:
    """Run servers and workers as children of this process; every child is reaped on return,
    error or Ctrl-C, and a failure saves what the servers hold before they stop. `dataset`,
    arrays the caller holds, is trained on in place of config.data; `loop` (ember.run) is
    what the workers run in place of the built-in loop."""
    timeline, memory = Timeline(), PeakMemory()
    start_forkserver()  # running already when `ember train` started it (engines/__init__.py)
    spares: list[Interpreter] = []
    try:
        spares += spare_servers(config)  # their imports run while the fork server imports torch
        with Progress(show_progress) as progress:
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
                work = NoModel() if loop and not loop.has_model else Forked(host.files, memory)
                setup = prepare_run(config, host.files.dataset(), work)
                setup.loop = loop
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
    config, processes, (timeline, memory) = setup.config, list[Any](), clocks
    pipes = RecordPipes(config.workers, lambda: FORKSERVER.Pipe(duplex=False))
    with Run(setup, progress, timeline, memory) as run, run.saving_on_failure():
        try:
            rows = files.train_rows // config.workers
            addresses = run.start_servers(rows_per_worker=rows)
            if config.mode.joinable:
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
                model_object=model_object(config),
                functions=user_functions(config),
                train_fn=setup.loop.fn if setup.loop else None,
                train_args=setup.loop.args if setup.loop else (),
                layout=setup.layout,
            )
            progress.phase("starting workers")
            timeline.mark("workers")
            for rank in range(config.workers):
                spec = dataclasses.replace(base, rank=rank)
                processes.append(_start_worker(spec, pipes, files))
            restarts = _watch(run, processes, pipes, base, files)
            seconds = time.perf_counter() - started
            return run.finish(seconds, {"worker_restarts": restarts})
        finally:
            # the workers go before the run ends: the servers' state is final when saved
            (setup.run_dir / JOIN_FILE).unlink(missing_ok=True)  # no longer joinable
            reap(processes)
            pipes.close_all()


def _start_worker(spec: WorkerSpec, pipes: RecordPipes, files: DataFiles) -> Any:
    log = Path(spec.run_dir) / "logs" / f"worker-{spec.rank}.log"
    pipe = pipes.open(spec.rank)
    process = FORKSERVER.Process(
        target=_child_main,
        args=(_work, (spec, pipe, files), str(log)),
        name=f"ember-worker-{spec.rank}",
        daemon=False,
    )
    try:
        process.start()
    finally:
        pipe.close()  # the worker has its own end: the pipe ends when the worker does
    return process


def _watch(
    run: Run, processes: list[Any], pipes: RecordPipes, base: WorkerSpec, files: DataFiles
) -> int:
    """Relay progress and restart a child that dies (up to max_restarts times each) or fail
    fast when it may not be restarted; returns how many restarts there were."""
    config, done = run.config, run.done
    incarnations = [0] * len(processes)
    failed: dict[int, tuple[int | None, str]] = {}  # rank -> (exit code, error) to act on
    final: set[int] = set()  # ranks whose error a restart would only repeat

    def relay(received: Iterable[tuple[int, dict[str, Any]]]) -> None:
        for rank, record in received:  # a pipe carries its current process's records alone
            if record.get("kind") == "error":
                failed[rank] = (None, record.get("error", ""))
                if not record.get("retry", True):
                    final.add(rank)
            elif record.get("kind") == "done":  # its peak, before it exits
                run.sample_memory(_pids(processes))
            run.relay(record)

    with run.watching(files.train_rows // config.workers):
        while len(done) < len(processes):
            relay(pipes.wait(0.25))
            for rank, process in enumerate(processes):
                if rank not in done and rank not in failed and process.exitcode is not None:
                    relay(pipes.read(rank))  # its last words, to the pipe's end
                    if rank not in done and rank not in failed:
                        failed[rank] = (process.exitcode, "")
            for rank, (exitcode, error) in sorted(failed.items()):
                if rank in final:  # its data, model or code: every worker would fail alike
                    _fail(run, rank, exitcode, error, "not restarted: it would fail again")
                if incarnations[rank] >= config.max_restarts or not config.uses_server:
                    _fail(run, rank, exitcode, error)
                reap([processes[rank]])
                incarnations[rank] += 1
                _note_restart(run, rank, incarnations[rank], exitcode, error)
                spec = dataclasses.replace(base, rank=rank, incarnation=incarnations[rank])
                processes[rank] = _start_worker(spec, pipes, files)
            failed.clear()
            run.tick(_pids(processes))
    return sum(incarnations)


def _pids(workers: list[Any]) -> list[int | None]:
    """The workers' pids and the fork server's, whose memory is the run's too."""
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    return [*pids_of(workers), getattr(server, "_forkserver_pid", None)]


def _note_restart(run: Run, rank: int, incarnation: int, exitcode: int | None, error: str) -> None:
    last = error.strip().splitlines()[-1:] or [""]
    record = WorkerRestart(rank=rank, incarnation=incarnation, exitcode=exitcode, error=error)
    text = f"worker {rank} {_how(exitcode)} {last[0]}; restarted (incarnation {incarnation})"
    run.note(record, text)


def _fail(run: Run, rank: int, exitcode: int | None, error: str, why: str = "") -> NoReturn:
    log = run.setup.run_dir / "logs" / f"worker-{rank}.log"
    how = f"{_how(exitcode)} ({why})" if why else _how(exitcode)
    # the traceback is in the log too (_work prints it there): said once, with the log's tail
    said = error.split("\n" + TRACEBACK)[0].strip() if TRACEBACK in tail(log) else error.strip()
    run.fail(
        WorkerFailure(rank=rank, exitcode=exitcode, error=error),
        f"worker {rank} {how}:\n{said or '(no traceback)'}\n"
        f"--- last lines of {log} ---\n{tail(log)}",
    )


TRACEBACK = "Traceback (most recent call last):"


def _how(exitcode: int | None) -> str:
    return f"exited with code {exitcode}" if exitcode is not None else "raised"


def _work(spec: WorkerSpec, pipe: Connection, files: DataFiles) -> None:
    from ember.userloop import run_user_loop
    from ember.worker import run_worker  # the fork server's, imported already

    records, started = RecordSender(pipe), False

    def report(record: dict[str, Any]) -> None:
        nonlocal started
        started = started or record.get("kind") == "start"
        records.send(record)

    try:
        dataset = files.shard(spec.rank, spec.world)  # mapped: its rows only, read-only
        work = run_user_loop if spec.train_fn is not None else run_worker
        records.send(work(spec, report, dataset))
    except BaseException as exc:
        text = traceback.format_exc()
        print(text, flush=True)
        error = f"{type(exc).__name__}: {exc}\n{text}"
        retry = not same_every_time(exc, started)
        record = WorkerError(rank=spec.rank, incarnation=spec.incarnation, error=error, retry=retry)
        records.send_last(record.to_json())
        raise SystemExit(1) from None


__all__ = ["train_local"]
