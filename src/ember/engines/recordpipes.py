"""The local workers' records to the launcher: one pipe per worker process, JSON on each. A
record is a dict only on the pipe: sent as Record.to_json(), read back as Record.from_json().

A single multiprocessing.Queue shared by the workers guards its pipe with a lock held across
processes while a record is written. A worker killed while holding it (SIGKILL, the OOM
killer) left the lock taken for good: every other worker's records stopped, those workers
hung at exit flushing them, and so did the run. With a pipe of its own, a killed worker can
only leave a torn record in its own pipe, which then ends; the other pipes go on."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection, wait

from ember.metrics import jsonable
from ember.metrics.records import Record


class RecordPipes:
    """The launcher's ends: the pipe of each rank's current process, read together."""

    def __init__(self, ranks: int, new_pipe: Callable[[], tuple[Connection, Connection]]) -> None:
        self._new_pipe = new_pipe
        self._readers: list[Connection | None] = [None] * ranks

    def open(self, rank: int) -> Connection:
        """A new pipe for `rank`'s next process (its earlier one is closed): returns the end to
        hand that process, which the caller closes once the process has it."""
        self.close(rank)
        reader, writer = self._new_pipe()
        self._readers[rank] = reader
        return writer

    def close(self, rank: int) -> None:
        reader, self._readers[rank] = self._readers[rank], None
        if reader is not None:
            reader.close()

    def close_all(self) -> None:
        for rank in range(len(self._readers)):
            self.close(rank)

    def is_open(self, rank: int) -> bool:
        return self._readers[rank] is not None

    def wait(self, timeout: float) -> Iterator[tuple[int, Record]]:
        """(rank, record) for every record that arrives within `timeout` seconds, and all that
        came with them; a pipe whose process is gone is read to its end and closed."""
        ready = [r for r in self._readers if r is not None]
        if not ready:
            time.sleep(timeout)  # nothing to read: only the time passes
            return
        arrived = set(wait(ready, timeout))
        for rank, reader in enumerate(list(self._readers)):
            if reader is not None and reader in arrived:
                yield from self.read(rank)

    def read(self, rank: int) -> Iterator[tuple[int, Record]]:
        """What `rank`'s pipe holds now, without waiting for more; once its process has exited
        that is everything it sent, and the pipe is closed."""
        reader = self._readers[rank]
        if reader is None:
            return
        try:
            while reader.poll(0):
                line = json.loads(reader.recv_bytes())
                if not isinstance(line, dict):
                    raise ValueError(f"a record is a JSON object, not {type(line).__name__}")
                yield rank, Record.from_json(line)
        except (EOFError, OSError, ValueError):
            # EOF: its process is gone (a torn last record too); garbage ends the stream as
            # well, and the worker, writing on, then fails on the closed pipe and is restarted
            self.close(rank)


class RecordSender:
    """A worker's end: sends each record whole, from any of its threads."""

    def __init__(self, pipe: Connection) -> None:
        self._pipe = pipe
        self._lock = threading.Lock()  # the exchanger thread reports too

    def send(self, record: Record) -> None:
        data = json.dumps(record.to_json(), default=jsonable).encode()
        with self._lock:
            self._pipe.send_bytes(data)

    def send_last(self, record: Record) -> None:
        """A failing worker's last words: lost if the launcher is gone already."""
        with contextlib.suppress(OSError):
            self.send(record)
