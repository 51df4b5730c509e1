"""Elastic scale-out: a worker that joins a running asynchronous run, and leaves it cleanly.

A local run of an asynchronous strategy writes `join.json` into its run directory (readable by
its owner only, removed when the run ends): the servers' addresses, the run's secret and its
configuration. `ember join RUN_DIR` reads it and trains one more worker against those servers
under a random worker id of its own, over the whole training set in its own order, starting
from the servers' parameters and, as hivemind's load_state_from_peers, at the run's place in
its learning-rate schedule (the furthest step the run's own workers have pushed). It leaves by
telling the servers it is done (after its epochs, or on Ctrl-C or SIGTERM), so nobody waits
for it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ember.config import RunConfig, Strategy
from ember.data.streamhost import host_run_data
from ember.errors import ConfigError
from ember.metrics.records import Record, WorkerDone
from ember.userfile import Unreadable, parse_json, read_regular
from ember.worker.spec import WorkerSpec

Report = Callable[[Record], None]  # where the joiner's records go

JOIN_FILE = "join.json"
JOINABLE = tuple(sorted(s.value for s in Strategy if s.joinable))  # sorted for error messages
JOINER_IDS = 1 << 30
MAX_JOIN_BYTES = 1 << 20  # a run writes a few KiB: addresses, the secret, its configuration
ADDRESS = re.compile(r"tcp://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):[0-9]{1,5}")


def write_join_file(run_dir: Path, config: RunConfig, servers: list[str], secret: bytes) -> Path:
    path = run_dir / JOIN_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds the secret
    with os.fdopen(fd, "w") as out:
        json.dump({"servers": servers, "secret": secret.hex(), "config": config.to_dict()}, out)
    return path


def read_join_file(path: Path, epochs: int | None) -> tuple[RunConfig, list[str], bytes]:
    """The run's configuration (with `epochs`; None: the run's own), servers and secret from
    its join file; a file that is missing, damaged, of the wrong kind or too large is one
    ConfigError naming it."""
    if not path.exists() and not path.is_symlink():
        raise ConfigError(
            f"{path} does not exist: the run is not running, or its strategy is not one of"
            f" {', '.join(JOINABLE)}"
        )
    damaged = f"{path} is not the join file a run writes"
    try:
        data = read_regular(path, MAX_JOIN_BYTES + 1)
    except Unreadable as exc:
        raise ConfigError(f"{damaged}: {exc}") from None
    if len(data) > MAX_JOIN_BYTES:
        raise ConfigError(f"{damaged}: larger than {MAX_JOIN_BYTES} bytes")
    try:
        saved = parse_json(data)
    except ValueError as exc:
        raise ConfigError(f"{damaged}: invalid JSON ({exc})") from None
    if not isinstance(saved, dict):
        raise ConfigError(f"{damaged}: not an object")
    servers, secret, fields = saved.get("servers"), saved.get("secret"), saved.get("config")
    if not (isinstance(servers, list) and servers and all(map(_is_address, servers))):
        raise ConfigError(
            f"{damaged}: 'servers' must be a non-empty list of tcp://HOST:PORT addresses,"
            f" got {servers!r:.200}"
        )
    if not (isinstance(secret, str) and re.fullmatch("[0-9a-f]{64}", secret)):
        raise ConfigError(f"{damaged}: 'secret' must be 64 hexadecimal digits")
    if not isinstance(fields, dict):
        raise ConfigError(f"{damaged}: 'config' must be an object, got {fields!r:.200}")
    try:
        given = {"epochs": epochs} if epochs is not None else {}
        config = RunConfig(**{**fields, **given}).validate()
    except (TypeError, ConfigError) as exc:  # a field RunConfig lacks, or a bad value
        raise ConfigError(f"{damaged}: {exc}") from None
    if not config.joinable:
        raise ConfigError(
            f"{path} claims strategy {config.strategy}, which cannot take a joiner;"
            f" a worker joins only a run of {', '.join(JOINABLE)}, or a worker range's run"
            " (--workers MIN:MAX) of a strategy with servers"
        )
    return config, list(servers), bytes.fromhex(secret)


def _is_address(value: object) -> bool:
    return isinstance(value, str) and ADDRESS.fullmatch(value) is not None


def join_run(run_dir: Path, epochs: int, report: Report = print) -> WorkerDone:
    """Train one more worker in the run at `run_dir` for `epochs` passes; return its totals."""
    path = run_dir / JOIN_FILE
    config, servers, secret = read_join_file(path, None)
    run_epochs = config.epochs
    if config.workers_max is None:  # a range's joiner takes the run's pieces, epoch by epoch
        config = replace(config, epochs=epochs)
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
        schedule_epochs=run_epochs,  # the run's learning rate, from where the run stands
    )
    from ember.worker.loop import run_worker  # torch: not for the launcher that writes join files

    if config.workers_max is None:
        return run_worker(spec, report, stop=stop)
    # A range's joiner holds or streams the rows as the run's members do (--data-mode), so
    # that it cuts the dealt pieces as they do.
    host = host_run_data(config, print)
    try:
        return run_worker(spec, report, host.files.shard(0, 1), stop=stop)
    finally:
        host.close()
