"""The zmq socket both ends open: its options and the largest frame it accepts."""

from __future__ import annotations

import zmq

from ember.wire.frames import CHUNK_BYTES, MAC_BYTES, MAX_HEADER_BYTES

# A frame is a header or one tensor chunk; anything larger makes zmq drop the peer before
# the bytes are buffered, so an oversized length never reaches an allocation of ours.
MAX_FRAME_BYTES = max(CHUNK_BYTES, MAC_BYTES + MAX_HEADER_BYTES) + 1024
# Replies queued for one peer, in messages (chunks of up to CHUNK_BYTES): a peer that does not
# read holds at most this much of a server; past it the ROUTER drops that peer's replies
# (without ROUTER_MANDATORY a full peer never blocks the server's one loop). 256 x 2 MiB lets
# an honest peer's reply of a 512 MiB shard leave in one burst.
ROUTER_SNDHWM = 256


def new_socket(context: zmq.Context, kind: int) -> zmq.Socket:
    """A socket of `kind` (ROUTER or DEALER) that drops unsent messages on close."""
    sock = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
    sock.setsockopt(zmq.SNDBUF, 4 << 20)
    sock.setsockopt(zmq.RCVBUF, 4 << 20)
    sock.setsockopt(zmq.SNDHWM, ROUTER_SNDHWM if kind == zmq.ROUTER else 1000)
    return sock
