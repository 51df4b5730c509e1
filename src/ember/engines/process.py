"""Child processes of a launcher: spawned (workers) or fresh interpreters (servers), logged to
a file, tied to the parent's life, reaped."""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import select
import signal
import socket
import subprocess
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


def _die_with_parent(parent: int | None = None) -> None:
    """Ask Linux to SIGKILL this child when the launcher dies, even by SIGKILL."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1 or (parent is not None and os.getppid() != parent):
        os._exit(1)  # the parent died before prctl took effect


class Interpreter:
    """A child that is a fresh interpreter, `python -m module`, so it never imports the user's
    `__main__` (spawn does, which a top-level spark-submit script cannot survive). Its input
    (`message`: the secret among it) goes on its stdin, never on its command line; it answers
    one line on its stdout; its output goes to `log_path`. It offers what reap and ServerGroup
    use of a multiprocessing.Process: pid, exitcode, is_alive, terminate, kill, join."""

    def __init__(
        self, module: str, message: bytes | None, name: str, log_path: Path | None
    ) -> None:
        """`message` None: it starts (its imports) and waits for `send`; `log_path` None: its
        output goes to the launcher's stderr until it takes up a log of its own."""
        self.name = name
        here = str(Path(__file__).resolve().parents[2])  # the ember this launcher runs
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": here if not path else os.pathsep.join([here, path])}
        safe_path = ["-P"] if sys.version_info >= (3, 11) else []  # not the cwd's modules
        opened = open(log_path, "ab", buffering=0) if log_path else None  # noqa: SIM115
        with opened or contextlib.nullcontext() as stderr:
            self._popen = subprocess.Popen(
                [sys.executable, *safe_path, "-m", module],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=env,
                # a session of its own: the terminal's Ctrl-C reaches the launcher alone, which
                # decides how children stop (a last checkpoint first)
                start_new_session=True,
            )
        assert self._popen.stdin is not None and self._popen.stdout is not None
        self._answer = self._popen.stdout
        if message is not None:
            try:
                self.send(message)
            except BaseException:
                self.kill()  # no one else holds it yet to reap it
                self.join(INPUT_SECONDS)
                raise

    def send(self, message: bytes) -> None:
        """Its whole input, once."""
        stdin = self._popen.stdin
        assert stdin is not None
        try:
            _write_within(stdin.fileno(), message, INPUT_SECONDS)
        except (BrokenPipeError, TimeoutError):
            pass  # it died at start-up, or hangs: readline says so, naming it
        finally:
            stdin.close()

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def exitcode(self) -> int | None:
        return self._popen.poll()  # negative for a signal, as multiprocessing's

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def terminate(self) -> None:
        if self.is_alive():
            self._popen.terminate()

    def kill(self) -> None:
        if self.is_alive():
            self._popen.kill()

    def join(self, timeout: float | None = None) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout)

    def readline(self, timeout: float) -> str | None:
        """The child's one-line answer; None when it exits or closes its stdout first, or
        says nothing within `timeout` seconds."""
        fd, line, deadline = self._answer.fileno(), b"", time.monotonic() + timeout
        try:
            while b"\n" not in line:
                left = deadline - time.monotonic()
                if left <= 0 or not wait_ready(fd, select.POLLIN, min(left, 0.5)):
                    if left <= 0 or not self.is_alive():
                        return None
                    continue
                chunk = os.read(fd, 4096)
                if not chunk:
                    return None
                line += chunk
        finally:
            self._answer.close()  # one line is all it says here
        return line.decode(errors="replace").strip()


def wait_ready(fd: int, event: int, seconds: float) -> bool:
    """Whether `fd` is ready for `event` (or at its end) within `seconds`. poll, not select:
    select refuses a descriptor numbered past 1023, and a driver that has run long may hold
    that many."""
    poller = select.poll()
    poller.register(fd, event)
    return bool(poller.poll(max(seconds, 0.0) * 1000))


INPUT_SECONDS = 10.0  # a child that has not read its input by then is not going to


def _write_within(fd: int, data: bytes, seconds: float) -> None:
    os.set_blocking(fd, False)
    deadline = time.monotonic() + seconds
    view = memoryview(data)
    while view:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        if wait_ready(fd, select.POLLOUT, left):
            view = view[os.write(fd, view) :]


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


def tail(path: Path, lines: int = 20, hint: str = EMPTY_LOG_HINT) -> str:
    """The last lines of a child's log, or a hint at the usual cause when it wrote nothing."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        text = ""
    return "\n".join(text.splitlines()[-lines:]) or hint


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
