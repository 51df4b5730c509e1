"""The zmq socket both ends open: its options, the largest frame it accepts, and the bytes of
replies a server lets one peer leave unread."""

from __future__ import annotations

import contextlib
import os
import resource
import time
from collections import deque

import zmq

from ember.wire.frames import CHUNK_BYTES, MAC_BYTES, MAX_HEADER_BYTES
from ember.wire.peers import HANDSHAKE_SECONDS

# A frame is a header or one tensor chunk; anything larger makes zmq drop the peer before
# the bytes are buffered, so an oversized length never reaches an allocation of ours.
MAX_FRAME_BYTES = max(CHUNK_BYTES, MAC_BYTES + MAX_HEADER_BYTES) + 1024
# Replies queued for one peer, in messages (chunks of up to CHUNK_BYTES): past it the ROUTER
# drops that peer's replies (without ROUTER_MANDATORY a full peer never blocks the server's
# one loop). This many lets an honest peer's reply of a 2 GiB shard leave in one burst, so a
# count of messages bounds little: ReplyBacklog bounds the bytes.
ROUTER_SNDHWM = (2 << 30) // CHUNK_BYTES
# Whole messages a ROUTER queues from one peer before it stops reading that connection: enough
# to keep a streamed push's folding busy, few enough that what zmq holds of a peer is small
# (peers.UNSEEN_BYTES counts on it).
ROUTER_RCVHWM = 8
# How long a server waits, once per oldest unread reply, for trackers zmq may have let go of
# already: pyzmq marks them done on a thread of its own, which needs the GIL and may lag.
TRACKER_GRACE_SECONDS = 0.2


def new_socket(context: zmq.Context, kind: int) -> zmq.Socket:
    """A socket of `kind` (ROUTER or DEALER) that drops unsent messages on close."""
    sock = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
    sock.setsockopt(zmq.SNDBUF, 4 << 20)
    sock.setsockopt(zmq.RCVBUF, 4 << 20)
    sock.setsockopt(zmq.SNDHWM, ROUTER_SNDHWM if kind == zmq.ROUTER else 1000)
    if kind == zmq.ROUTER:
        sock.setsockopt(zmq.RCVHWM, ROUTER_RCVHWM)
        # libzmq's own bound on a transport handshake; peers.py bounds the rest of it
        sock.setsockopt(zmq.HANDSHAKE_IVL, int(HANDSHAKE_SECONDS * 1000))
    return sock


def server_io_threads() -> int:
    """A server process's I/O threads: one per two cores, up to 4, for lanes to spread over."""
    return min(4, max(1, (os.cpu_count() or 1) // 2))


def use_io_threads(count: int) -> None:
    """Give this process's shared context `count` I/O threads, which libzmq spreads its
    connections over (a lane's chunks then copy in parallel with another's); only before
    the process opens its first socket, after which the count is fixed."""
    zmq.Context.instance(io_threads=count)


def raise_open_file_limit() -> None:
    """Raise this process's soft limit on open files to its hard limit: a server holds a
    descriptor per connection, and the common default of 1,024 is soon reached."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class ReplyBacklog:
    """Bytes of zero-copy reply chunks each peer has not taken off the server yet.

    A chunk counts until zmq lets go of it: written to the peer's TCP socket, or dropped at
    the high-water mark. Each one may hold a buffer of its own (a reply read while an update
    moved the shard to a private copy, or an easgd difference), so what a peer that sends
    requests and never reads replies makes a server hold is what this counts. An honest peer
    reads each reply before its next request, so it never has more than that one reply here,
    but pyzmq learns that zmq let go of a reply on its garbage-collector thread, which lags on
    a busy host: past the budget, the server gives that thread TRACKER_GRACE_SECONDS before
    it calls the peer a slow reader, once per oldest reply (a reader that never reads costs
    the server one such wait, not one per request).
    """

    def __init__(self, budget: int, grace: float = TRACKER_GRACE_SECONDS) -> None:
        self.budget, self.grace = budget, grace
        self._queued: dict[bytes, deque[tuple[int, zmq.MessageTracker]]] = {}
        self._bytes: dict[bytes, int] = {}
        self._waited: dict[bytes, zmq.MessageTracker] = {}  # the oldest reply waited for

    def sent(self, peer: bytes, nbytes: int, tracker: zmq.MessageTracker) -> None:
        self._prune(peer)
        self._queued.setdefault(peer, deque()).append((nbytes, tracker))
        self._bytes[peer] = self._bytes.get(peer, 0) + nbytes

    def unread(self, peer: bytes) -> int:
        """Bytes of `peer`'s replies zmq still holds."""
        self._prune(peer)
        return self._bytes.get(peer, 0)

    def refusal(self, peer: bytes) -> str:
        """What a peer over budget is told (one small header; the high-water mark drops
        those past it)."""
        unread, budget = self.unread(peer) >> 20, self.budget >> 20
        return (
            f"slow reader: {unread} MiB of this connection's replies are unread, more than "
            f"the {budget} MiB a server queues for one connection; read each reply before "
            "sending more requests"
        )

    def over_budget(self, peer: bytes) -> bool:
        if self.unread(peer) <= self.budget:
            return False
        queue = self._queued[peer]
        if self._waited.get(peer) is queue[0][1]:
            return True
        self._waited[peer] = queue[0][1]
        deadline = time.monotonic() + self.grace
        for _, tracker in list(queue):
            try:
                tracker.wait(max(0.0, deadline - time.monotonic()))
            except zmq.NotDone:
                break
            if self.unread(peer) <= self.budget:
                return False
        return self.unread(peer) > self.budget

    def forget(self, peer: bytes) -> None:
        """The peer's connection closed: zmq drops what it queued for it."""
        self._queued.pop(peer, None)
        self._bytes.pop(peer, None)
        self._waited.pop(peer, None)

    def peers(self) -> int:
        """Peers with replies still queued (a peer whose queue empties is not kept)."""
        for peer in list(self._queued):
            self._prune(peer)
        return len(self._queued)

    def _prune(self, peer: bytes) -> None:
        # One peer's messages leave in the order they were queued, so the done ones are first.
        queue = self._queued.get(peer)
        if queue is None:
            return
        while queue and queue[0][1].done:
            self._bytes[peer] -= queue.popleft()[0]
        if not queue:
            del self._queued[peer], self._bytes[peer]
            self._waited.pop(peer, None)
