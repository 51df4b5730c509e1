"""Child processes of a launcher: spawned, logged to a file, tied to the parent's life, reaped."""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

SPAWN = mp.get_context("spawn")  # fork would copy torch's threads and locks into the child


def start_child(
    target: Callable[..., Any], args: tuple[Any, ...], name: str, log_path: Path
) -> Any:
    process = SPAWN.Process(
        target=_child_main, args=(target, args, str(log_path)), name=name, daemon=False
    )
    process.start()
    return process


def _child_main(target: Callable[..., Any], args: tuple[Any, ...], log_path: str) -> None:
    _die_with_parent()
    # Ctrl-C reaches the whole process group; the launcher alone decides how children stop
    # (a last checkpoint first), so children ignore it and wait for its SIGTERM.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    log = open(log_path, "ab", buffering=0)  # noqa: SIM115 - lives as long as the process
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    target(*args)


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this child when the launcher dies, even by SIGKILL."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def reap(processes: Iterable[Any], grace: float = 3.0) -> None:
    """Terminate every child still running, then kill what outlives `grace` seconds."""
    processes = [p for p in processes if p is not None]
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + grace
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join(1.0)


EMPTY_LOG_HINT = (
    "(the log is empty: the child died while starting. If ember.fit runs from a script, call it"
    ' under `if __name__ == "__main__":`, since spawned children import that script)'
)


def tail(path: Path, lines: int = 20) -> str:
    """The last lines of a child's log, or a hint at the usual cause when it wrote nothing."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        text = ""
    return "\n".join(text.splitlines()[-lines:]) or EMPTY_LOG_HINT


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
