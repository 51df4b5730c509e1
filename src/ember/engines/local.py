"""The local engine: S server processes and N worker processes on this machine."""

from __future__ import annotations

import dataclasses
import queue
import time
import traceback
from pathlib import Path
from typing import Any

import safetensors.numpy

from ember.checkpoint import latest_valid_checkpoint
from ember.config import RunConfig
from ember.engines.join import JOIN_FILE, write_join_file
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
    servers = setup.server_group() if config.uses_server else None
    processes: list[Any] = []
    try:
        addresses = servers.start() if servers is not None else []
        if config.mode.joinable:
            write_join_file(setup.run_dir, config, addresses, setup.secret)
        records = SPAWN.Queue()
        started = time.perf_counter()
        initial_file = None
        if not config.uses_server and setup.resume is not None:  # small spawn arguments only
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
        )
        for rank in range(config.workers):
            processes.append(_start_worker(dataclasses.replace(base, rank=rank), records))
        results, restarts = _watch(setup, processes, records, servers, show_progress, base)
        seconds = time.perf_counter() - started
        extra: dict[str, Any] = {"worker_restarts": restarts}
        if servers is not None:
            params = servers.snapshot()["params"]
            servers.checkpoint(setup.checkpoints, checkpoint_meta(config, params.size, 0))
            extra["server"] = merge_server_stats(servers.stop())
            extra["server"]["failovers_and_restarts"] = servers.events
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
        (setup.run_dir / JOIN_FILE).unlink(missing_ok=True)  # the run can no longer be joined
        reap(processes)
        if servers is not None:
            reap(servers.processes)


def save_what_the_servers_hold(setup: RunSetup, servers: ServerGroup) -> None:
    """On failure or Ctrl-C, a last checkpoint keeps the progress made since the previous one
    (briefly: a server that does not answer at once is not going to)."""
    if not all(s.process is not None and s.process.exitcode is None for s in servers.primary_slots):
        setup.metrics.write({"kind": "run", "event": "final checkpoint skipped: a server is down"})
        return
    try:
        path = servers.checkpoint(
            setup.checkpoints, checkpoint_meta(setup.config, setup.initial.size, 0), timeout=10.0
        )
    except EmberError as exc:
        setup.metrics.write({"kind": "run", "event": "final checkpoint failed", "error": str(exc)})
        return
    setup.metrics.write({"kind": "run", "event": "final checkpoint", "path": str(path)})


def _start_worker(spec: WorkerSpec, records: Any) -> Any:
    log = Path(spec.run_dir) / "logs" / f"worker-{spec.rank}.log"
    return start_child(_work, (spec, records), f"ember-worker-{spec.rank}", log)


def _watch(
    setup: RunSetup,
    processes: list[Any],
    records: Any,
    servers: ServerGroup | None,
    show_progress: bool,
    base: WorkerSpec,
) -> tuple[list[dict[str, Any]], int]:
    """Relay progress, checkpoint the servers on schedule, and restart a child that dies
    (up to max_restarts times each) or fail fast when it may not be restarted."""
    config = setup.config
    rows = len(setup.dataset.x_train) // config.workers
    total = config.epochs * (rows // config.batch_size) * config.batch_size * config.workers
    done: dict[int, dict[str, Any]] = {}
    incarnations = [0] * len(processes)
    failed: dict[int, tuple[int | None, str]] = {}  # rank -> (exit code, error) to act on
    reported: list[dict[str, Any]] = []  # the servers' events already written

    def drain(timeout: float) -> None:
        record = _next(records, timeout)
        while record is not None:
            rank = record.get("rank", -1)
            if record.get("incarnation", incarnations[rank]) == incarnations[rank]:
                if record.get("kind") == "error":
                    failed[rank] = (None, record.get("error", ""))
                setup.metrics.write(record)
                if record.get("kind") == "done":
                    done[rank] = record
                bar.update(record)
            record = _next(records, 0.0)

    with Progress(total, enabled=show_progress) as bar:
        while len(done) < len(processes):
            drain(0.25)
            for rank, process in enumerate(processes):
                if rank not in done and rank not in failed and process.exitcode is not None:
                    drain(1.0)  # its last words may still be in the pipe
                    if rank not in done and rank not in failed:
                        failed[rank] = (process.exitcode, "")
            for rank, (exitcode, error) in sorted(failed.items()):
                if incarnations[rank] >= config.max_restarts or not config.uses_server:
                    _fail(setup, rank, exitcode, error)
                reap([processes[rank]])
                incarnations[rank] += 1
                _note_restart(setup, rank, incarnations[rank], exitcode, error, bar)
                spec = dataclasses.replace(base, rank=rank, incarnation=incarnations[rank])
                processes[rank] = _start_worker(spec, records)
            failed.clear()
            if servers is not None:
                servers.keep_alive(setup.checkpoints)
                servers.checkpoint_if_due(
                    setup.checkpoints, checkpoint_meta(config, setup.initial.size, 0)
                )
                for event in servers.events[len(reported) :]:
                    reported.append(event)
                    setup.metrics.write({"kind": "server", **event})
                    bar.note(_describe(event))
    return [done[rank] for rank in sorted(done)], sum(incarnations)


def _describe(event: dict[str, Any]) -> str:
    details = ", ".join(f"{k}: {v}" for k, v in event.items() if k not in ("event", "server"))
    return f"{event.get('server', 'parameter servers')} {event['event']} ({details})"


def _note_restart(
    setup: RunSetup, rank: int, incarnation: int, exitcode: int | None, error: str, bar: Progress
) -> None:
    last = error.strip().splitlines()[-1:] or [""]
    setup.metrics.write(
        {
            "kind": "restart",
            "rank": rank,
            "incarnation": incarnation,
            "exitcode": exitcode,
            "error": error,
        }
    )
    bar.note(f"worker {rank} {_how(exitcode)} {last[0]}; restarted (incarnation {incarnation})")


def _fail(setup: RunSetup, rank: int, exitcode: int | None, error: str) -> None:
    log = setup.run_dir / "logs" / f"worker-{rank}.log"
    setup.metrics.write({"kind": "failure", "rank": rank, "exitcode": exitcode, "error": error})
    raise WorkerFailed(
        f"worker {rank} {_how(exitcode)}:\n{error.strip() or '(no traceback)'}\n"
        f"--- last lines of {log} ---\n{tail(log)}"
    )


def _how(exitcode: int | None) -> str:
    return f"exited with code {exitcode}" if exitcode is not None else "raised"


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
            {
                "kind": "error",
                "rank": spec.rank,
                "incarnation": spec.incarnation,
                "error": f"{type(exc).__name__}: {exc}\n{text}",
            }
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
