"""Child processes in tests: the no-stray-children check, and finding and watching a run's
children."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

Pids = frozenset[int] | set[int]
SRC = str(Path(__file__).resolve().parents[1] / "src")


def run_python(code: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """`python -c code args...` with this checkout's ember first on its path; it must exit 0."""
    env = {**os.environ, "PYTHONPATH": SRC}
    command = [sys.executable, "-c", code, *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return done


def kill_stray_children(keep: Pids = frozenset(), keep_under: Pids = frozenset()) -> list[int]:
    """Kill this process's live descendants except `keep`, those descended from `keep_under`
    (looked up per process, so one forked after the caller listed the tree is kept too) and
    multiprocessing's resource tracker; return the pids that were still there."""
    me = psutil.Process(os.getpid())
    stray = [
        p
        for p in me.children(recursive=True)
        if p.pid not in keep
        and not _descends_from(p, keep_under)
        and p.is_running()
        and p.status() != psutil.STATUS_ZOMBIE
        and "resource_tracker" not in " ".join(command_line(p))
    ]
    for process in stray:
        process.kill()
    return [p.pid for p in stray]


def _descends_from(process: psutil.Process, ancestors: Pids) -> bool:
    try:
        return any(parent.pid in ancestors for parent in process.parents())
    except psutil.Error:
        return False


def command_line(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def has_worker_records(out: Path) -> bool:
    metrics = out / "metrics.jsonl"
    return metrics.exists() and '"kind": "worker"' in metrics.read_text()


def has_progress(out: Path) -> bool:
    """A checkpoint recording that workers had taken steps exists."""
    last = out / "checkpoints" / "last"
    if not last.exists():
        return False
    manifest = out / "checkpoints" / last.read_text().strip() / "manifest.json"
    workers = json.loads(manifest.read_text())["meta"]["workers"]
    return all(w["step"] > 0 for w in workers.values())


def log_of(process: psutil.Process) -> str:
    """Which child a process is, from the log file it writes to (its other open files, such
    as the data files a worker maps, left out)."""
    try:
        return " ".join(f.path for f in process.open_files() if f.path.endswith(".log"))
    except psutil.Error:
        return ""
