"""Elastic scale-out: a worker that joins a running asynchronous run, and leaves it cleanly.

A local run of an asynchronous strategy writes `join.json` into its run directory (readable by
its owner only, removed when the run ends): the servers' addresses, the run's secret and its
configuration. `ember join RUN_DIR` reads it and trains one more worker against those servers
under a random worker id of its own, over the whole training set in its own order. It leaves by
telling the servers it is done (after its epochs, or on Ctrl-C or SIGTERM), so nobody waits
for it.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import threading
from pathlib import Path
from typing import Any

from ember.config import RunConfig, Strategy
from ember.errors import ConfigError
from ember.spec import WorkerSpec

JOIN_FILE = "join.json"
JOINABLE = tuple(sorted(s.value for s in Strategy if s.joinable))  # sorted for error messages
JOINER_IDS = 1 << 30


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
    except ValueError as exc:
        raise ConfigError(f"{path} is not the join file a run writes: {exc}") from None
    try:
        config = RunConfig(**{**saved["config"], "epochs": epochs}).validate()
        secret, servers = bytes.fromhex(saved["secret"]), list(saved["servers"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path} is not the join file a run writes: {exc!r}") from None
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    # A random id: two joiners starting at once must never share one (the servers would take
    # the second for the first reconnecting), and an id names no other worker of the run.
    worker = config.workers + secrets.randbelow(JOINER_IDS)
    spec = WorkerSpec(
        config,
        worker,
        config.workers,
        servers,
        secret,
        run_dir=str(run_dir),
        own_rows=True,  # the whole training set, shuffled by its own id
    )
    from ember.worker import run_worker  # torch: not for the launcher that writes join files

    return run_worker(spec, report, stop=stop)
