"""Elastic scale-out: a worker that joins a running asynchronous run, and leaves it cleanly.

A local run of an asynchronous strategy writes `join.json` into its run directory (readable by
its owner only, removed when the run ends): the servers' addresses, the run's secret and its
configuration. `ember join RUN_DIR` reads it and trains one more worker against those servers
under a worker id no one holds, over the whole training set in its own order. It leaves by
telling the servers it is done (after its epochs, or on Ctrl-C or SIGTERM), so nobody waits
for it.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

from ember.config import RunConfig
from ember.errors import ConfigError, ProtocolError
from ember.ps import control
from ember.worker import WorkerSpec, run_worker

JOIN_FILE = "join.json"
JOINABLE = ("async", "easgd-async", "ssp")  # no round waits for a newcomer or a leaver


def write_join_file(run_dir: Path, config: RunConfig, servers: list[str], secret: bytes) -> Path:
    path = run_dir / JOIN_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds the secret
    with os.fdopen(fd, "w") as out:
        json.dump({"servers": servers, "secret": secret.hex(), "config": config.to_dict()}, out)
    return path


def join_run(run_dir: Path, epochs: int, report: Any = print) -> dict[str, Any]:
    """Train one more worker in the run at `run_dir` for `epochs` passes; return its totals."""
    path = run_dir / JOIN_FILE
    try:
        saved = json.loads(path.read_text())
    except OSError:
        raise ConfigError(
            f"{path} does not exist: the run is not running, or its strategy is not one of"
            f" {', '.join(JOINABLE)}"
        ) from None
    config = RunConfig(**{**saved["config"], "epochs": epochs}).validate()
    secret = bytes.fromhex(saved["secret"])
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    for _ in range(8):  # another joiner may take the same id at the same moment
        worker = _free_worker_id(saved["servers"], secret, config)
        spec = WorkerSpec(
            config,
            worker,
            config.workers,
            saved["servers"],
            secret,
            run_dir=str(run_dir),
            own_rows=True,  # the whole training set, shuffled by its own id
        )
        try:
            return run_worker(spec, report, stop=stop)
        except ProtocolError as exc:
            if "is not newer" not in str(exc):
                raise
    raise ConfigError(f"no free worker id to join the run at {run_dir}")


def _free_worker_id(servers: list[str], secret: bytes, config: RunConfig) -> int:
    primaries = [address.split(",")[0] for address in servers]
    stats = control(primaries[:1], secret, "stats", timeout=config.request_timeout)[0]
    return max([config.workers - 1, *stats["known_workers"]]) + 1
