"""The local engine: S server processes and N worker processes on this machine."""

from __future__ import annotations

import queue
import time
import traceback
from typing import Any

import safetensors.numpy

from ember.checkpoint import latest_valid_checkpoint
from ember.config import RunConfig
from ember.engines.process import SPAWN, free_port, reap, start_child, tail
from ember.engines.progress import Progress
from ember.engines.run import RunResult, RunSetup, finish_run, prepare_run
from ember.engines.servers import ServerGroup
from ember.errors import CheckpointError, EmberError, WorkerFailed
from ember.worker import WorkerSpec, checkpoint_meta, run_worker


def train_local(config: RunConfig, show_progress: bool = True) -> RunResult:
    """Run servers and workers as children of this process; every child is reaped on return,
    error or Ctrl-C, and a failure saves what the servers hold before they stop."""
    setup = prepare_run(config)
    servers = (
        ServerGroup(config, setup.initial, setup.secret, setup.run_dir / "logs", setup.resume)
        if config.uses_server
        else None
    )
    processes: list[Any] = []
    try:
        addresses = servers.start() if servers is not None else []
        records = SPAWN.Queue()
        rendezvous = f"tcp://127.0.0.1:{free_port()}"
        started = time.perf_counter()
        initial_file = None
        if not config.uses_server and setup.resume is not None:  # small spawn arguments only
            initial_file = str(setup.run_dir / "logs" / "start-state.safetensors")
            safetensors.numpy.save_file({"params": setup.initial}, initial_file)
        for rank in range(config.workers):
            spec = WorkerSpec(
                config,
                rank,
                config.workers,
                addresses,
                setup.secret,
                rendezvous,
                str(setup.run_dir),
                initial_file=initial_file,
                initial_step=setup.resumed_step,
            )
            processes.append(
                start_child(
                    _work,
                    (spec, records),
                    f"ember-worker-{rank}",
                    setup.run_dir / "logs" / f"worker-{rank}.log",
                )
            )
        results = _watch(setup, processes, records, servers, show_progress)
        seconds = time.perf_counter() - started
        extra: dict[str, Any] = {}
        if servers is not None:
            params = servers.snapshot()["params"]
            servers.checkpoint(setup.checkpoints, checkpoint_meta(config, params.size, 0))
            extra["server"] = merge_server_stats(servers.stop())
        else:
            final = latest_valid_checkpoint(setup.checkpoints)
            if final is None:
                raise CheckpointError(f"worker 0 left no checkpoint in {setup.checkpoints}")
            params = final.tensors["params"]
        last = latest_valid_checkpoint(setup.checkpoints)
        extra["checkpoint"] = str(last.path) if last else None
        return finish_run(setup, params, results, seconds, extra)
    except BaseException:
        reap(processes)  # workers first, so the servers' state is final when it is saved
        if servers is not None and servers.addresses:
            save_what_the_servers_hold(setup, servers)
        raise
    finally:
        reap(processes)
        if servers is not None:
            reap(servers.processes)


def save_what_the_servers_hold(setup: RunSetup, servers: ServerGroup) -> None:
    """On failure or Ctrl-C, a last checkpoint keeps the progress made since the previous one."""
    try:
        path = servers.checkpoint(
            setup.checkpoints, checkpoint_meta(setup.config, setup.initial.size, 0)
        )
    except EmberError as exc:
        setup.metrics.write({"kind": "run", "event": "final checkpoint failed", "error": str(exc)})
        return
    setup.metrics.write({"kind": "run", "event": "final checkpoint", "path": str(path)})


def _watch(
    setup: RunSetup,
    processes: list[Any],
    records: Any,
    servers: ServerGroup | None,
    show_progress: bool,
) -> list[dict[str, Any]]:
    """Relay progress, checkpoint the servers on schedule, and fail fast when a child dies."""
    config = setup.config
    rows = len(setup.dataset.x_train) // config.workers
    total = config.epochs * (rows // config.batch_size) * config.batch_size * config.workers
    done: dict[int, dict[str, Any]] = {}
    with Progress(total, enabled=show_progress) as bar:
        while len(done) < len(processes):
            record = _next(records, 0.25)
            while record is not None:
                _handle(setup, record, done, bar)
                record = _next(records, 0.0)
            for rank, process in enumerate(processes):
                if rank not in done and process.exitcode is not None:
                    record = _next(records, 1.0)  # its last words may still be in the pipe
                    while record is not None:
                        _handle(setup, record, done, bar)
                        record = _next(records, 0.0)
                    if rank not in done:
                        _fail(setup, rank, process.exitcode, "")
            if servers is not None:
                servers.check_alive()
                servers.checkpoint_if_due(
                    setup.checkpoints, checkpoint_meta(config, setup.initial.size, 0)
                )
    return [done[rank] for rank in sorted(done)]


def _handle(
    setup: RunSetup, record: dict[str, Any], done: dict[int, dict[str, Any]], bar: Progress
) -> None:
    kind = record.get("kind")
    if kind == "error":
        _fail(setup, record["rank"], None, record.get("error", ""))
    setup.metrics.write(record)
    if kind == "done":
        done[record["rank"]] = record
    bar.update(record)


def _fail(setup: RunSetup, rank: int, exitcode: int | None, error: str) -> None:
    log = setup.run_dir / "logs" / f"worker-{rank}.log"
    how = f"exited with code {exitcode}" if exitcode is not None else "raised"
    setup.metrics.write({"kind": "failure", "rank": rank, "exitcode": exitcode, "error": error})
    raise WorkerFailed(
        f"worker {rank} {how}:\n{error.strip() or '(no traceback)'}\n"
        f"--- last lines of {log} ---\n{tail(log)}"
    )


def _next(records: Any, timeout: float) -> dict[str, Any] | None:
    try:
        return records.get(timeout=timeout) if timeout > 0 else records.get_nowait()
    except queue.Empty:
        return None


def _work(spec: WorkerSpec, records: Any) -> None:
    try:
        records.put(run_worker(spec, records.put))
    except BaseException as exc:
        text = traceback.format_exc()
        print(text, flush=True)
        records.put(
            {"kind": "error", "rank": spec.rank, "error": f"{type(exc).__name__}: {exc}\n{text}"}
        )
        raise SystemExit(1) from None


def merge_server_stats(stats: list[dict[str, Any]]) -> dict[str, Any]:
    rejected: dict[str, int] = {}
    for shard in stats:
        for reason, count in shard.get("rejected", {}).items():
            rejected[reason] = rejected.get(reason, 0) + count
    return {
        "shards": len(stats),
        "updates": max((s.get("step", 0) for s in stats), default=0),
        "rejected": rejected,
        "events": [e for s in stats for e in s.get("events", [])],
    }


__all__ = ["train_local"]
