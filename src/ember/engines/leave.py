"""A member of a worker range's run that leaves while the run goes on: `ember leave RUN_DIR
--worker K`, or SIGTERM to that worker's process.

A local run of a worker range writes `members.json` into its run directory (its owner's only,
removed when the run ends): each running rank's worker pid, rewritten when a rank is
restarted or gone.
`ember leave` sends that worker SIGTERM, once it has checked that the process is the run's
worker K (it writes the run's logs/worker-K.log). The worker, which under a range takes SIGTERM
as a request to leave, ends its loop after the step in hand, tells the servers it is done and
reports what it trained; the others go on, and the launcher neither restarts it nor fails the
run.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import psutil

from ember.errors import ConfigError
from ember.userfile import Unreadable, parse_json, read_regular

MEMBERS_FILE = "members.json"
MAX_MEMBERS_BYTES = 1 << 20


def write_members(run_dir: Path, pids: dict[int, int]) -> None:
    """Each rank's worker pid, for `ember leave`; written whole, then renamed into place."""
    path, temporary = run_dir / MEMBERS_FILE, run_dir / f".{MEMBERS_FILE}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"pids": {str(rank): pid for rank, pid in pids.items()}}, out)
    os.replace(temporary, path)


def leave_on_sigterm() -> threading.Event:
    """In a range's worker: SIGTERM sets the returned event, which ends its loop cleanly."""
    asked = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: asked.set())
    return asked


def ask_to_leave(run_dir: Path, worker: int) -> int:
    """SIGTERM to worker `worker` of the range run at `run_dir`; returns its pid. Anything that
    is not that run's live worker is one ConfigError naming what is wrong."""
    path = run_dir / MEMBERS_FILE
    try:
        data = read_regular(path, MAX_MEMBERS_BYTES + 1)
        pids = parse_json(data).get("pids") if len(data) <= MAX_MEMBERS_BYTES else None
    except (Unreadable, ValueError, AttributeError) as exc:
        raise ConfigError(
            f"{path} cannot be read ({exc}): the run is not running, or not of a worker range"
            " (--workers MIN:MAX)"
        ) from None
    pid = pids.get(str(worker)) if isinstance(pids, dict) else None
    if not isinstance(pid, int) or isinstance(pid, bool):
        known = ", ".join(sorted(pids, key=int)) if isinstance(pids, dict) else "none"
        raise ConfigError(f"the run at {run_dir} has no worker {worker} (its workers: {known})")
    log = str((run_dir / "logs" / f"worker-{worker}.log").resolve())
    try:
        process = psutil.Process(pid)
        writes_log = any(f.path == log for f in process.open_files())
    except psutil.Error:
        writes_log = False
    if not writes_log:
        raise ConfigError(f"worker {worker} of the run at {run_dir} is not running (pid {pid})")
    process.send_signal(signal.SIGTERM)
    return pid
