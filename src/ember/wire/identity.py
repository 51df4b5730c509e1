"""Which worker each authenticated connection speaks for: a connection claims one worker id,
and a worker id is held by at most one open connection, so no peer can act for a worker
another connection holds (its region, its `done`, its pushes)."""

from __future__ import annotations


class Identities:
    """Worker ids claimed by connections (peers), released when their connection closes."""

    def __init__(self) -> None:
        self._worker_of: dict[bytes, int] = {}
        self._holder_of: dict[int, bytes] = {}

    def claim(self, peer: bytes, worker: int, takeover: bool = False) -> str | None:
        """Let `peer` speak for `worker`; None if it may, else why not. A connection speaks
        for one worker only. With `takeover` (a registration: a worker's new incarnation on a
        new connection) it takes the id from the connection holding it, which may not
        speak for it any more; otherwise an id another open connection holds is refused."""
        mine = self._worker_of.get(peer)
        if mine is not None and mine != worker:
            return f"this connection speaks for worker {mine}, not for worker {worker}"
        holder = self._holder_of.get(worker)
        if holder is not None and holder != peer:
            if not takeover:
                return f"worker {worker} is held by another connection"
            del self._worker_of[holder]
        self._worker_of[peer] = worker
        self._holder_of[worker] = peer
        return None

    def release(self, peer: bytes) -> None:
        """`peer`'s connection closed: the worker it held is free for a new connection."""
        worker = self._worker_of.pop(peer, None)
        if worker is not None and self._holder_of.get(worker) == peer:
            del self._holder_of[worker]

    def __len__(self) -> int:
        return len(self._worker_of)
