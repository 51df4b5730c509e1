"""The local engine's fork server: workers are forked from a process that has imported torch
and ember already (and only that: no threads, no run state), rather than each spawned to
import them again. It starts first thing in `ember train`, so its imports run while the
launcher loads data and starts the servers; the launcher never imports torch itself, and
has the model's starting parameters and final evaluation worked out by forks of it too
(modelwork.py)."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.forkserver
import os
import signal

FORKSERVER = mp.get_context("forkserver")
FORKSERVER.set_forkserver_preload(
    ["ember.engines.forkserver", "torch", "ember.worker.loop", "ember.engines.local"]
)


def start_forkserver() -> None:
    """Start the fork server if it is not running; returns at once, while it imports."""
    multiprocessing.forkserver.ensure_running()


def stop_forkserver() -> None:
    """The fork server goes with the run that started it: nothing outlives the run.
    It holds no state and its children are gone by then, so it is killed: let to exit, it
    would spend seconds unloading torch while the launcher waits."""
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    pid, stop = getattr(server, "_forkserver_pid", None), getattr(server, "_stop", None)
    if pid is not None and stop is not None:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        stop()  # reaps it and forgets it, so that the next run starts a new one
