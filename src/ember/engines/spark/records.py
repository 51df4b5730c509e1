"""Progress records streamed from the training tasks to the driver while the stage runs.

A task's records reach the driver as rows only when the task ends, too late for a progress
bar. So each task also sends them, one sealed msgpack header each, to a collector the driver
opens: an authenticated endpoint (the run's secret, as the servers'), bounded per connection
and in total. Sending never waits on the training thread and never fails a task: a record the
collector cannot take in time is dropped, since the rows the task returns stay the record.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections import Counter
from typing import Any

from ember.engines.addresses import Placement, bind_first
from ember.metrics.records import Record
from ember.wire import CONNECTION_ERRORS, ClientConnection, Request, ServerEndpoint

RECORDS_PER_CONNECTION = 100_000  # a task's records past this are dropped
QUEUED_RECORDS = 10_000  # records waiting for the driver past this are dropped
CONNECT_SECONDS = 10.0  # a task gives up streaming when the collector does not answer by then
SEND_SECONDS = 0.5  # and drops a record the socket does not take within this
POLL_SECONDS = 0.2


class RecordCollector:
    """The driver's side: on a thread of its own, takes the records authenticated tasks send
    and queues them for `drain`; a peer without the secret is never heard. It listens where
    the parameter servers do (`where`), and `address` is what tasks are told."""

    def __init__(
        self,
        secret: bytes,
        where: Placement | None = None,
        per_connection: int = RECORDS_PER_CONNECTION,
        queued: int = QUEUED_RECORDS,
        slots: int = 0,
    ) -> None:
        def listen(bind: str) -> ServerEndpoint:
            return ServerEndpoint(secret, bind, max_payload_bytes=0)  # headers only

        where = where or Placement()
        # after the ports the server slots start at (see ServerGroup._launch)
        ports = where.candidates(first=slots)
        self._endpoint = bind_first(listen, where.bind, ports, "the Spark record collector")
        self.address = where.advertised(self._endpoint.address)
        self.per_connection = per_connection
        self._queue: queue.Queue[Record] = queue.Queue(maxsize=queued)
        self._taken: Counter[bytes] = Counter()  # records queued per connection
        self.dropped = 0  # records past a bound
        self.refused = 0  # authenticated messages that were not a record
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="ember-records", daemon=True)
        self._thread.start()

    @property
    def rejected(self) -> Counter[str]:
        """Messages refused before authentication, by reason (e.g. "unauthenticated")."""
        return self._endpoint.rejected

    def _serve(self) -> None:
        try:
            while not self._stop.is_set():
                message = self._endpoint.poll(POLL_SECONDS)
                if isinstance(message, Request):
                    self._take(message)
        finally:
            self._endpoint.close()

    def _take(self, request: Request) -> None:
        line = request.header.get("record")
        record = _decoded(line) if request.header.get("op") == "record" else None
        if record is None:
            self.refused += 1
        elif self._taken[request.peer] >= self.per_connection:
            self.dropped += 1
        else:
            try:
                self._queue.put_nowait(record)
                self._taken[request.peer] += 1
            except queue.Full:
                self.dropped += 1

    def drain(self) -> list[Record]:
        """The records that arrived since the last call, in their order of arrival."""
        records = []
        while True:
            try:
                records.append(self._queue.get_nowait())
            except queue.Empty:
                return records

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5 * POLL_SECONDS)

    def __enter__(self) -> RecordCollector:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class RecordSender:
    """A task's side: `send` queues a record without waiting (dropping it when the queue is
    full); a thread of its own connects to the collector and sends them. A collector that
    cannot be reached ends the streaming, never the task."""

    def __init__(self, address: str, secret: bytes, queued: int = 1000) -> None:
        self.address = address
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=queued)
        self.dropped = 0
        self._thread = threading.Thread(
            target=self._run, args=(secret,), name="ember-record-sender", daemon=True
        )
        self._thread.start()

    def send(self, record: dict[str, Any]) -> None:
        if not self._thread.is_alive():
            return
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1

    def _run(self, secret: bytes) -> None:
        try:
            connection = ClientConnection(self.address, secret, CONNECT_SECONDS)
        except CONNECTION_ERRORS:
            return  # no live progress for this task; its rows still reach the driver
        try:
            while (record := self._queue.get()) is not None:
                if not connection.notify({"op": "record", "record": record}, SEND_SECONDS):
                    self.dropped += 1
        except CONNECTION_ERRORS:
            return
        finally:
            connection.close(linger=1.0)  # the last records still leave, in the background

    def close(self, timeout: float = 2.0) -> None:
        """Send what is queued (for up to `timeout` seconds), then stop."""
        if not self._thread.is_alive():
            return
        with contextlib.suppress(queue.Full):  # a full queue: the sender gives up at timeout
            self._queue.put(None, timeout=timeout)
        self._thread.join(timeout)


def _decoded(line: Any) -> Record | None:
    """A task's record as the collector takes it; None for anything that is not one."""
    if not isinstance(line, dict):
        return None
    try:
        return Record.from_json(line)
    except ValueError:
        return None
