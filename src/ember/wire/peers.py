"""Which TCP connection a ROUTER peer is, so that its state ends when the connection does.

libzmq's monitor says a connection was accepted or closed by its file descriptor, never by
routing id, and without draft APIs (ZMQ_ROUTER_NOTIFY) no message says it either. So each
accepted fd is resolved to the peer's (address, port) with getpeername at once, and a peer
that passed the handshake names its own local port in a sealed `bind`: the server binds
the routing id to the fd only when an accepted connection from that address and port exists
and no other peer holds it. When that fd closes, the peer's session, stream and region go.
A peer behind address translation cannot be bound this way and keeps the old behaviour.
"""

from __future__ import annotations

import contextlib
import os
import socket

import zmq
from zmq.utils.monitor import recv_monitor_message

EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED


def _peername(fd: int, local: bool = False) -> tuple[str, int] | None:
    """(address, port) of the far end (or this end with `local`) of socket `fd`, or None."""
    try:
        copy = os.dup(fd)
    except OSError:
        return None
    try:
        sock = socket.socket(fileno=copy)
    except OSError:
        # By the time the monitor's news is read, libzmq may have closed the connection and
        # reused its number for an eventfd or a pipe: not a socket, and the copy stays ours.
        os.close(copy)
        return None
    try:
        name = sock.getsockname() if local else sock.getpeername()
        return (str(name[0]), int(name[1]))
    except (OSError, IndexError, TypeError, ValueError):
        return None
    finally:
        sock.close()


def local_port(fd: int) -> int | None:
    """This end's port of a connected socket `fd` (a DEALER's, from its monitor)."""
    name = _peername(fd, local=True)
    return None if name is None else name[1]


class PeerConnections:
    """A ROUTER's accepted connections by fd, and the peers bound to them."""

    def __init__(self, sock: zmq.Socket) -> None:
        self._monitor: zmq.Socket | None = sock.get_monitor_socket(EVENTS)
        self._sock = sock
        self._accepted: dict[int, tuple[str, int]] = {}  # fd -> the peer's (address, port)
        self._peer_by_fd: dict[int, bytes] = {}
        self._fd_by_peer: dict[bytes, int] = {}

    def closed(self) -> list[bytes]:
        """Read the monitor's news; the peers whose connections closed since the last call."""
        gone: list[bytes] = []
        while self._monitor is not None and self._monitor.poll(0, zmq.POLLIN):
            event = recv_monitor_message(self._monitor)
            fd = int(event["value"])
            if event["event"] == zmq.EVENT_ACCEPTED:
                name = _peername(fd)
                if name is not None:
                    self._accepted[fd] = name
                continue
            self._accepted.pop(fd, None)
            peer = self._peer_by_fd.pop(fd, None)
            if peer is not None:
                del self._fd_by_peer[peer]
                gone.append(peer)
        return gone

    def bind(self, peer: bytes, address: str, port: object) -> bool:
        """Bind `peer` to the accepted connection from (address, port), if there is exactly
        such a connection and no peer holds it yet."""
        if peer in self._fd_by_peer:
            return False
        if not isinstance(port, int) or isinstance(port, bool):
            return False
        self.closed()  # an accept reported just now must be known before it is looked up
        for fd, name in self._accepted.items():
            if name == (address, port) and fd not in self._peer_by_fd:
                self._peer_by_fd[fd] = peer
                self._fd_by_peer[peer] = fd
                return True
        return False

    def stats(self) -> dict[str, int]:
        return {"accepted": len(self._accepted), "bound": len(self._fd_by_peer)}

    def close(self) -> None:
        if self._monitor is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._sock.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = None
