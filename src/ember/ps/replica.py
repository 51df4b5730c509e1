"""Shard replication: a primary ships its whole state to its backup at a bounded lag.

The primary copies its parameters, rule state, open synchronous round and clock table at a
moment when no update is half-applied, and hands the copy to a Replicator thread, which sends
it to the backup and awaits its acknowledgement. Serving never waits on the backup: while a
copy is in flight no new one is taken, so the backup lags by at most the interval plus one
transfer. A backup applies a copy whole or not at all.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from enum import Enum
from typing import Any

import numpy as np

from ember.errors import ProtocolError
from ember.ps.clockrows import COLUMNS, check_layout, read_rows
from ember.ps.protocol import Copy, Promote
from ember.ps.replies import Replies
from ember.ps.shard import Shard
from ember.wire import (
    CONNECTION_ERRORS,
    Chunk,
    ClientConnection,
    Request,
    ServerEndpoint,
    tensors_from_frames,
)

CONNECT_TIMEOUT = 2.0  # a backup that is being restarted is retried at the next copy
SEND_TIMEOUT = 30.0  # how long the primary waits for its backup to acknowledge a copy


class Role(str, Enum):
    PRIMARY = "primary"  # serves workers, and ships copies to its backup if it has one
    BACKUP = "backup"  # takes copies from its primary until it is promoted

    def __str__(self) -> str:  # stats and messages print the plain name, on any Python
        return str(self.value)


class Replicator:
    """The primary's sender to its backup, on a thread of its own (it owns the socket)."""

    def __init__(self, address: str, secret: bytes, timeout: float) -> None:
        self.address, self._secret, self._timeout = address, secret, timeout
        self._queue: queue.Queue[tuple[dict[str, Any], list[np.ndarray]] | None] = queue.Queue()
        self._idle = threading.Event()
        self._idle.set()
        self._connection: ClientConnection | None = None
        self.sent, self.failures, self.last_error = 0, 0, ""
        self._thread = threading.Thread(target=self._run, name="ember-replicator", daemon=True)
        self._thread.start()

    @property
    def idle(self) -> bool:
        return self._idle.is_set()

    def offer(self, header: dict[str, Any], arrays: list[np.ndarray]) -> None:
        """Send a copy the caller no longer touches; call only when `idle`."""
        self._idle.clear()
        self._queue.put((header, arrays))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            header, arrays = item
            try:
                if self._connection is None:
                    self._connection = ClientConnection(
                        self.address, self._secret, CONNECT_TIMEOUT, watch=True
                    )
                    self._connection.timeout = self._timeout
                self._connection.send(header, arrays)
                self._connection.recv()
                self.sent += 1
            except CONNECTION_ERRORS as exc:  # the backup is down or restarting: retry next copy
                self.failures += 1
                self.last_error = str(exc)
                self._drop_connection()
            finally:
                self._idle.set()
        self._drop_connection()

    def _drop_connection(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(self._timeout + CONNECT_TIMEOUT)

    def stats(self) -> dict[str, Any]:
        return {
            "backup": self.address,
            "copies_sent": self.sent,
            "failures": self.failures,
            "last_error": self.last_error,
        }


class Replication:
    """A shard's side of replication, working on the Shard it is handed: as a primary,
    taking its snapshots and giving them to a Replicator; as a backup, restoring the copies its
    primary sends, whole or not at all, until it is promoted."""

    def __init__(
        self,
        shard: Shard,
        endpoint: ServerEndpoint,
        replies: Replies,
        secret: bytes,
        *,
        role: Role,
        backup: str | None,
        interval: float,
        cursor: Callable[[], dict[str, Any] | None] = lambda: None,
    ) -> None:
        """`cursor`: the primary's data cursor (pieces.py) to copy with its state, if any."""
        self.shard, self.endpoint, self.replies = shard, endpoint, replies
        self.cursor = cursor
        self.cursor_copy: dict[str, Any] | None = None  # a backup's: the last copy's cursor
        self.role, self.interval, self._secret = role, interval, secret
        self.replicator = self._replicator(backup)
        self.copy_arriving: Request | None = None  # a copy from the primary, header accepted
        self._copy: Copy | None = None  # what that header says
        self._copied_at = 0.0

    def _replicator(self, backup: str | None) -> Replicator | None:
        return None if backup is None else Replicator(backup, self._secret, SEND_TIMEOUT)

    @property
    def copy_due(self) -> bool:
        """A primary with a backup copies its state every `interval`, once the previous copy
        is acknowledged; the caller also makes sure no update is half-applied."""
        replicator = self.replicator
        return (
            replicator is not None
            and replicator.idle
            and time.monotonic() - self._copied_at >= self.interval
        )

    def send_copy(self) -> None:
        assert self.replicator is not None
        copy = self.shard.snapshot()
        header = Copy(names=tuple(copy.tensors), step=copy.step, round=copy.round).header()
        cursor = self.cursor()
        if cursor is not None:
            header["pieces"] = cursor
        self.replicator.offer(header, [*copy.tensors.values(), copy.rows])
        self._copied_at = time.monotonic()

    def accept_copy(self, request: Request) -> None:
        """A copy's header: its payload is taken only if it fits this shard as it is."""
        spec = self.shard.spec
        if self.role is Role.PRIMARY:
            raise ProtocolError(f"shard {spec.index} is a primary; it takes no copies")
        names, header = list(self.shard.copied()), request.header
        table = header.get("tensors")
        if (
            header.get("names") != names
            or not isinstance(table, list)
            or table[:-1] != [["float32", [spec.size]] for _ in names]
        ):
            self.shard.rejected["shape"] += 1
            raise ProtocolError(
                f"a copy for shard {spec.index} must carry {names} and the clock table"
            )
        try:
            copy = Copy.from_header(header)
            check_layout(table[-1], self.shard.clocks.max_workers)
        except ProtocolError as exc:
            raise ProtocolError(f"malformed copy of shard {spec.index}: {exc}") from None
        self.copy_arriving, self._copy = request, copy

    def on_chunk(self, chunk: Chunk) -> None:
        if chunk.request is not self.copy_arriving or self.role is not Role.BACKUP:
            return  # refused at its header
        if chunk.error is not None:
            self.copy_arriving = None
            raise ProtocolError(chunk.error)
        if chunk.request.complete:
            self.copy_arriving = None
            assert self._copy is not None
            self._apply(chunk.request, self._copy)

    def _apply(self, request: Request, copy: Copy) -> None:
        header, shard = request.header, self.shard
        spec, names, max_rows = shard.spec, copy.names, shard.clocks.max_workers
        limit = 4 * spec.size * len(names) + 8 * len(COLUMNS) * max_rows
        *tensors, table = tensors_from_frames(header["tensors"], request.frames, limit)
        try:  # every row is checked before anything is replaced
            rows = read_rows(header["tensors"][-1], table, max_rows)
        except ProtocolError as exc:
            raise ProtocolError(f"malformed copy of shard {spec.index}: {exc}") from None
        self.replies.release_for_writing()  # a snapshot in flight may still read the old state
        shard.restore(dict(zip(names, tensors, strict=True)), copy.step, copy.round, rows)
        pieces = header.get("pieces")  # checked when a promotion first deals from it
        self.cursor_copy = pieces if isinstance(pieces, dict) else None
        shard.counters["copies_applied"] += 1
        self.endpoint.reply(request, {"op": "ok", "step": shard.step})

    def promote(self, request: Request) -> None:
        """The launcher saw this shard's primary die: serve workers from the last copy."""
        backup = Promote.from_header(request.header).backup
        self.copy_arriving = None  # a copy still on its way is older than what we now serve
        if self.role is not Role.PRIMARY:
            self.role = Role.PRIMARY
            self.shard.clocks.touch_all()  # silence as a backup is not the workers' fault
            self.shard.clocks.events.append({"event": "promoted", "step": self.shard.step})
        if backup is not None and self.replicator is None:
            self.replicator = self._replicator(backup)
        # 0: it serves the checkpoint it started from
        copies = self.shard.counters["copies_applied"]
        self.endpoint.reply(
            request, {"op": "ok", "step": self.shard.step, "copies_applied": copies}
        )

    def stats(self) -> dict[str, Any] | None:
        return None if self.replicator is None else self.replicator.stats()

    def close(self) -> None:
        if self.replicator is not None:
            self.replicator.close()
