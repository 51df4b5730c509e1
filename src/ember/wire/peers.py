"""Which TCP connection each message came on, and how much a connection may hold before and
after it authenticates.

zmq names the descriptor of the connection every received message came on (SRCFD), and the
socket's monitor says when a descriptor was accepted and when it closed. So a connection's
routing id is known from its first message, the session it authenticates is tied to it, and
everything kept for it goes when it closes, whether or not the peer says anything more.

What libzmq holds of a connection before ember sees a byte of it (a handshake command of
up to a frame's size, an unfinished multipart message of any size) is bounded here, since
libzmq bounds neither: the kernel says how many bytes it took from the peer (TCP_INFO's
bytes_received), and the server knows how many zmq handed it. A connection is shut down
(shutdown(2) on its socket: zmq sees the stream end and frees what it held) when:
- before its first message, it sent more than PRE_AUTH_BYTES (a CURVE handshake is under
  2 KiB), or it is one of more than MAX_HANDSHAKING such connections and the oldest;
- after it, zmq holds more than UNSEEN_BYTES of it that the server has not been handed;
- it has not authenticated HANDSHAKE_SECONDS after it was accepted.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import time
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_ACCEPT_FAILED
HANDSHAKE_SECONDS = 10.0  # from accept to an authenticated session (CURVE, then HMAC)
MAX_HANDSHAKING = 256  # connections accepted that have sent no message yet (64 KiB each)
PRE_AUTH_BYTES = 64 << 10  # what a connection may send before its first message
# What zmq may hold of a connection and not yet have handed over: the kernel's receive
# buffer (twice the 4 MiB asked for), the ROUTER's queue of whole messages (RCVHWM of them,
# sockets.py) and one frame being decoded; an unfinished message grows past it.
UNSEEN_BYTES = 24 << 20
SCAN_SECONDS = 0.01  # how often the byte counts are read, at the least
_TCP_INFO_BYTES_RECEIVED = slice(128, 136)  # struct tcp_info's tcpi_bytes_received (Linux)
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass
class Connection:
    address: tuple[str, int]  # the peer's (address, port), to check a descriptor before use
    accepted: float  # time.monotonic() of the accept
    peer: bytes | None = None  # its routing id, from its first message
    handed: int = 0  # bytes of it zmq handed the server, framing included
    authenticated: bool = False
    ended: bool = False  # shut down by the server; zmq closes it when it sees that


def _peername(fd: int) -> tuple[str, int] | None:
    """(address, port) of the far end of socket `fd`, or None."""
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
        name = sock.getpeername()
        return (str(name[0]), int(name[1]))
    except (OSError, IndexError, TypeError, ValueError):
        return None
    finally:
        sock.close()


def _shutdown(fd: int, address: tuple[str, int]) -> None:
    """End the connection on `fd` if it is still the one from `address`; zmq closes it."""
    with contextlib.suppress(OSError):
        copy = os.dup(fd)
        with socket.socket(fileno=copy) as sock:
            if sock.getpeername()[:2] == address:
                sock.shutdown(socket.SHUT_RDWR)


def _bytes_received(fd: int) -> int | None:
    info = ctypes.create_string_buffer(256)
    length = ctypes.c_uint32(len(info))
    if _libc.getsockopt(fd, socket.IPPROTO_TCP, socket.TCP_INFO, info, ctypes.byref(length)):
        return None  # not TCP (ipc), or already closed
    if length.value < _TCP_INFO_BYTES_RECEIVED.stop:
        return None  # a kernel older than 4.1 does not count them
    return int.from_bytes(info.raw[_TCP_INFO_BYTES_RECEIVED], "little")


def _order(peer: bytes) -> int:
    """Where a routing id the ROUTER made (a zero byte, then a counter) stands in the order
    peers connected; -1 for one a peer chose, which never displaces one the ROUTER made."""
    return int.from_bytes(peer[1:], "big") if len(peer) == 5 and peer[0] == 0 else -1


def framed(nbytes: int, encrypted: bool) -> int:
    """Bytes a message of `nbytes` took on the wire: ZMTP's frame header, and CURVE's
    MESSAGE command (name, nonce, MAC and flags) around it."""
    body = nbytes + (33 if encrypted else 0)
    return body + (2 if body <= 255 else 9)


class PeerConnections:
    """A ROUTER's accepted connections by fd, the peers on them, and their bounds."""

    def __init__(self, sock: zmq.Socket, encrypted: bool) -> None:
        self._monitor: zmq.Socket | None = sock.get_monitor_socket(EVENTS)
        self._sock = sock
        self._encrypted = encrypted
        self._by_fd: dict[int, Connection] = {}
        self._fd_by_peer: dict[bytes, int] = {}
        self._scanned = 0.0
        self._gone: list[bytes] = []  # peers whose connections are known to be gone
        self.shed: dict[str, int] = {
            "size": 0,
            "count": 0,
            "time": 0,
            "unseen": 0,
            "forged": 0,
            "lane": 0,
        }

    def closed(self) -> list[bytes]:
        """Read the monitor's news; the peers whose connections closed since the last call.

        The news lags behind the messages, so a descriptor may be reused by a new connection
        before its old one's close is read: the kernel's peer address of the descriptor, read
        now, says which connection an event or a message is about."""
        while self._monitor is not None and self._monitor.poll(0, zmq.POLLIN):
            event = recv_monitor_message(self._monitor)
            fd = int(event["value"])
            if event["event"] == zmq.EVENT_ACCEPTED:
                self._adopt(fd)
            elif event["event"] == zmq.EVENT_ACCEPT_FAILED:
                self._shed_handshaking(len(self._by_fd) // 2)  # out of descriptors
            elif fd in self._by_fd and _peername(fd) != self._by_fd[fd].address:
                self._forget(fd)  # else the close of an older connection on the number
        gone, self._gone = self._gone, []
        return gone

    def _adopt(self, fd: int) -> Connection | None:
        """The connection on `fd` now: the one known, or a new one in place of a closed one."""
        name = _peername(fd)
        known = self._by_fd.get(fd)
        if known is not None and known.address == name:
            return known
        self._forget(fd)
        if name is None:
            return None
        found = self._by_fd[fd] = Connection(name, time.monotonic())
        return found

    def _forget(self, fd: int) -> None:
        connection = self._by_fd.pop(fd, None)
        if connection is not None and connection.peer is not None:
            self._drop_peer(fd, connection.peer)

    def _drop_peer(self, fd: int, peer: bytes) -> None:
        if self._fd_by_peer.get(peer) == fd:
            del self._fd_by_peer[peer]
        self._gone.append(peer)

    def arrived(self, fd: int, peer: bytes, nbytes: int) -> bool:
        """Count a message of `nbytes` from `peer` on `fd`; False when it came on a
        connection that is closed by now, or that is another peer's."""
        if fd < 0:
            return True  # inproc: no connection to tie anything to
        connection = self._by_fd.get(fd)
        if connection is None or connection.peer not in (None, peer):
            connection = self._adopt(fd)
            if connection is None:
                return False
        if connection.peer != peer:
            # A message read late from a closed connection whose number this one reuses, or
            # this one's first: the ROUTER numbers its peers in the order they connect.
            if connection.peer is not None:
                if connection.authenticated or _order(peer) <= _order(connection.peer):
                    return False
                self._drop_peer(fd, connection.peer)
            connection.peer = peer
            self._fd_by_peer[peer] = fd
        connection.handed += nbytes
        return True

    def authenticate(self, peer: bytes) -> None:
        """`peer` proved the secret on its connection, which keeps it from now on."""
        fd = self._fd_by_peer.get(peer)
        if fd is not None:
            self._by_fd[fd].authenticated = True

    def police(self) -> None:
        """Shut down connections past their bounds (see the module's docstring); reads the
        kernel's counts at most every SCAN_SECONDS, or a little less often for many
        connections, so that it never takes more than a few percent of the server's time."""
        now = time.monotonic()
        if now - self._scanned < max(SCAN_SECONDS, 40e-6 * len(self._by_fd)):
            return
        self._scanned = now
        waiting: list[tuple[float, int]] = []
        for fd, connection in list(self._by_fd.items()):
            if connection.ended:
                continue
            if connection.authenticated:
                limit = UNSEEN_BYTES
            elif now - connection.accepted > HANDSHAKE_SECONDS:
                self._end(fd, "time")
                continue
            else:
                limit = PRE_AUTH_BYTES if connection.peer is None else UNSEEN_BYTES
            received = _bytes_received(fd)
            if received is not None and received - connection.handed > limit:
                self._end(fd, "size" if connection.peer is None else "unseen")
            elif connection.peer is None:
                waiting.append((connection.accepted, fd))
        # The newest are spared: a handshake that completed may not have been read yet.
        excess = sorted(waiting)[: max(0, len(waiting) - MAX_HANDSHAKING)]
        for accepted, fd in excess:
            if now - accepted > 1.0:
                self._end(fd, "count")

    def _shed_handshaking(self, count: int) -> None:
        """Shut down the `count` oldest connections that have not authenticated."""
        waiting = sorted(
            (c.accepted, fd) for fd, c in self._by_fd.items() if not (c.authenticated or c.ended)
        )
        for _, fd in waiting[:count]:
            self._end(fd, "count")

    def cut(self, peer: bytes, reason: str) -> None:
        """Shut down `peer`'s connection now (it sent a frame that failed its checks)."""
        fd = self._fd_by_peer.get(peer)
        if fd is not None:
            self._end(fd, reason)

    def _end(self, fd: int, reason: str) -> None:
        connection = self._by_fd.get(fd)
        if connection is not None:
            self.shed[reason] += 1
            connection.ended = True
            _shutdown(fd, connection.address)

    def stats(self) -> dict[str, int]:
        authenticated = sum(c.authenticated for c in self._by_fd.values())
        return {"accepted": len(self._by_fd), "bound": authenticated}

    def close(self) -> None:
        if self._monitor is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._sock.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = None
