"""Request and Chunk: what a ServerEndpoint hands its server, and what it reads off a frame."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import zmq

from ember.errors import ProtocolError


@dataclass
class Request:
    """An authenticated request. Its payload streams in after the header, one message per
    chunk: `frames` fills as they arrive, and `sizes` says what each must hold."""

    peer: bytes
    header: dict[str, Any]
    frames: list[Any] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)  # declared byte size of each payload frame
    sealed: bytes = b""  # its header frame's MAC, which the bulk frames' tags bind
    dropped: bool = False  # refused: its AEAD chunks are still opened, to keep the counters
    # Striped (lanes.py): the peers its chunks and its reply's chunks travel on, the
    # requesting connection first; chunk i goes on lanes[i % len(lanes)].
    lanes: tuple[bytes, ...] = ()
    replied: int = 0  # reply chunks sent so far
    reply_binding: bytes = b""  # the reply header's MAC, which its bulk frames' tags bind

    @property
    def complete(self) -> bool:
        return len(self.frames) == len(self.sizes)


@dataclass
class Chunk:
    """One payload frame of a streaming request has arrived (it is request.frames[index]), or
    the stream broke (`error` says why; the request gets no more chunks)."""

    request: Request
    index: int
    error: str | None = None


def peer_address(frame: Any) -> str:
    """The IP address a frame came from (zmq's "Peer-Address"); "" when the transport has
    none, as inproc."""
    try:
        return str(frame.get("Peer-Address"))
    except (zmq.ZMQError, AttributeError):
        return ""


def source_fd(frame: Any) -> int:
    """The descriptor of the connection a frame came on (zmq's SRCFD); -1 without one."""
    try:
        return int(frame.get(zmq.SRCFD))
    except (zmq.ZMQError, AttributeError, TypeError):
        return -1


def reason(exc: ProtocolError) -> str:
    """The counter a refusal is filed under."""
    text = str(exc)
    names = ("bulk frame", "unauthenticated", "HMAC", "msgpack", "size", "map", "slow reader")
    for name in (*names, "lane"):
        if name in text:
            return name.lower().replace(" ", "_")
    return "malformed"
