"""Replies: the buffers zero-copy replies are sent from, and the keys replies in flight read."""

from __future__ import annotations

import numpy as np

from ember.ps.shard import ALL_KEYS, Shard, ShardSpec
from ember.wire import CHUNK_BYTES, SendTicket

# Reply buffers kept for reuse: one per reply an honest peer can have in flight is plenty;
# more would keep what a burst of replies to a slow reader allocated alive for good.
POOL_BUFFERS = 2


def unread_budget(spec: ShardSpec, state_names: tuple[str, ...]) -> int:
    """Reply bytes one peer may leave unread before the server refuses its requests (see
    wire.sockets.ReplyBacklog): the shard's largest reply (a snapshot: parameters and rule
    state) and one more copy of the parameters. An honest peer has at most one reply out."""
    return max(CHUNK_BYTES, 4 * spec.size * (2 + len(state_names)))


class Replies:
    """Zero-copy replies hand zmq the server's own arrays: this keeps each one untouched
    until its send ticket is done, by reusing reply buffers only after that and by moving
    the shard to private copies before an update of keys a reply still reads."""

    def __init__(self, shard: Shard) -> None:
        self._shard = shard
        self._reading: list[tuple[slice, SendTicket]] = []  # replies that read the shard's keys
        self._pool: list[tuple[np.ndarray, SendTicket | None]] = []

    def buffer(self) -> np.ndarray:
        """A reusable reply buffer zmq has finished sending (fresh pages cost a first touch)."""
        for i, (buffer, ticket) in enumerate(self._pool):
            if ticket is None or ticket.done:
                del self._pool[i]
                return buffer
        return np.empty(self._shard.params.size, np.float32)

    def recycle(self, buffer: np.ndarray, ticket: SendTicket | None) -> None:
        """`buffer` (from `buffer()`) is sent; it is reused once `ticket` is done. Past
        POOL_BUFFERS the oldest is let go: zmq keeps one it still reads alive by itself."""
        self._pool.append((buffer, ticket))
        del self._pool[:-POOL_BUFFERS]

    def reading(self, keys: slice, ticket: SendTicket) -> None:
        """A reply reads the shard's params (and state) at `keys` until `ticket` is done."""
        self._reading.append((keys, ticket))

    def release_for_writing(self, keys: slice = ALL_KEYS) -> None:
        """Before an in-place update of `keys`: if zmq still reads them for a reply or snapshot
        in flight, move on to a private copy and leave the old buffer to zmq, so a slow reader
        never sees a torn update and never stalls the server."""
        self._reading = [(read, t) for read, t in self._reading if not t.done]
        if not any(_overlap(read, keys) for read, _ in self._reading):
            return
        self._shard.move_to_private_copies()
        self._reading.clear()
        self._shard.counters["copies_for_slow_readers"] += 1


def _overlap(a: slice, b: slice) -> bool:
    return a.start < b.stop and b.start < a.stop
