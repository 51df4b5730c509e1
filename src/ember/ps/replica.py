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
from collections import Counter
from typing import Any

import numpy as np
import torch

from ember.errors import ProtocolError
from ember.ps.clocks import ClockTable
from ember.wire import (
    CONNECTION_ERRORS,
    ClientConnection,
    Request,
    ServerEndpoint,
    gather,
    tensors_from_frames,
)

CONNECT_TIMEOUT = 2.0  # a backup that is being restarted is retried at the next copy


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


class Replicated:
    """The replication half of ParameterServer: taking copies as a backup, sending them as a
    primary, and promotion. It works on the server's own state."""

    shard: Any
    rule: Any
    params: torch.Tensor
    state: dict[str, torch.Tensor]
    round_sum: torch.Tensor | None
    round_count: int
    round_clock: int
    step: int
    clocks: ClockTable
    endpoint: ServerEndpoint
    rejected: Counter[str]
    counters: Counter[str]
    role: str
    replica_seconds: float
    replicator: Replicator | None
    _secret: bytes
    _replicated_at: float
    _copy_arriving: Request | None
    _arriving: dict[bytes, Any]
    _held: list[Any]

    def _release_params_for_writing(self) -> None:
        raise NotImplementedError  # ParameterServer's: a reply in flight may read the params

    def _replicator(self, backup: str | None) -> Replicator | None:
        return None if backup is None else Replicator(backup, self._secret, timeout=30.0)

    def _replica_names(self) -> list[str]:
        names = ["params", *self.rule.state_names]
        return names + (["round_sum"] if self.round_sum is not None else [])

    def _replica_tensor(self, name: str) -> torch.Tensor:
        if name == "params":
            return self.params
        if name == "round_sum":
            assert self.round_sum is not None
            return self.round_sum
        return self.state[name]

    def _maybe_replicate(self) -> None:
        """Copy the state to the backup when due, the previous copy is acknowledged, and no
        update is half-applied (a push mid-stream, or folded into a round but not answered)."""
        replicator = self.replicator
        if (
            replicator is None
            or not replicator.idle
            or time.monotonic() - self._replicated_at < self.replica_seconds
            or any(h.streaming and h.worker.live for h in self._arriving.values())
            or any(h.folded for h in self._held)
        ):
            return
        names = self._replica_names()
        header = {
            "op": "replicate",
            "seq": 0,
            "names": names,
            "step": self.step,
            "round": [self.round_count, self.round_clock],
            "workers": self.clocks.replica_table(),
        }
        replicator.offer(header, [self._replica_tensor(n).numpy().copy() for n in names])
        self._replicated_at = time.monotonic()

    def _check_replica(self, request: Request) -> None:
        if self.role == "primary":
            raise ProtocolError(f"shard {self.shard.index} is a primary; it takes no copies")
        size = self.shard.stop - self.shard.start
        names = self._replica_names()
        if request.header.get("names") != names or request.header.get("tensors") != [
            ["float32", [size]] for _ in names
        ]:
            self.rejected["shape"] += 1
            raise ProtocolError(f"a copy for shard {self.shard.index} must carry {names}")
        self._copy_arriving = request

    def _apply_replica(self, request: Request) -> None:
        header, size = request.header, self.shard.stop - self.shard.start
        names = header["names"]
        tensors = tensors_from_frames(header["tensors"], request.frames, 4 * size * len(names))
        if not isinstance(header.get("step"), int):
            raise ProtocolError(f"malformed copy of shard {self.shard.index}: no step")
        try:
            round_count, round_clock = (int(v) for v in header["round"])
            self.clocks.restore(header["workers"])
        except (TypeError, ValueError, KeyError) as exc:
            raise ProtocolError(f"malformed copy of shard {self.shard.index}: {exc}") from None
        self._release_params_for_writing()
        for name, chunks in zip(names, tensors, strict=True):
            gather(chunks, self._replica_tensor(name).numpy())
        self.step = header["step"]
        self.round_count, self.round_clock = round_count, round_clock
        self.counters["copies_applied"] += 1
        self.endpoint.reply(request, {"op": "ok", "step": self.step})

    def _promote(self, request: Request) -> None:
        """The launcher saw this shard's primary die: serve workers from the last copy."""
        backup = request.header.get("backup")
        self._copy_arriving = None  # a copy still on its way is older than what we now serve
        if self.role != "primary":
            self.role = "primary"
            self.clocks.touch_all()  # silence while we were a backup is not the workers' fault
            self.clocks.events.append({"event": "promoted", "step": self.step})
        if isinstance(backup, str) and self.replicator is None:
            self.replicator = self._replicator(backup)
        copies = self.counters["copies_applied"]  # 0: it serves the checkpoint it started from
        self.endpoint.reply(request, {"op": "ok", "step": self.step, "copies_applied": copies})
