"""Peers that misbehave towards a server, and what a server process holds while they do: for
the hardening tests and lab/benchmarks/hardening.py, which measures the same attacks."""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from ember.ps import PSClient
from ember.wire import ClientConnection, connection, curve, sockets
from ember.wire.endpoint import Chunk, Request, ServerEndpoint
from ember.wire.frames import mac
from ember.wire.handshake import HELLO, NONCE_BYTES, PROOF, WELCOME, open_session
from tests.curve_peer import CurvePeer, read_frame, recv_exact

MiB = 1 << 20
ATTACK_SECONDS = 60.0  # the most one unfinished message is sent for
FRAME_BYTES = MiB  # under the sockets' largest frame, so zmq buffers each one whole


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def settled_rss(pid: int, seconds: float = 10.0) -> int:
    """Process `pid`'s RSS once it stops moving (two readings 0.2 s apart within 256 KiB, for
    `seconds` at most): a fixed wait was too short for its imports on a loaded machine."""
    deadline, last = time.monotonic() + seconds, rss(pid)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = rss(pid)
        if abs(now - last) < 256 * 1024:
            return now
        last = now
    return last


def open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


# An endpoint polled in a process of its own: what the process holds is what the server keeps
# for its peers. It stops when its stdin closes, or after 100 s whatever happens.
_ENDPOINT_PROCESS = """
import select, sys, time
from ember.wire import ServerEndpoint
endpoint = ServerEndpoint(bytes.fromhex(sys.argv[1]), encrypt=sys.argv[2] == "on")
print(endpoint.address, flush=True)
deadline = time.monotonic() + 100
while time.monotonic() < deadline and not select.select([sys.stdin], [], [], 0)[0]:
    endpoint.poll(0.05)
endpoint.close()
"""


@contextmanager
def endpoint_process(
    encrypt: bool, secret: bytes, open_files: int | None = None
) -> Iterator[tuple[int, str]]:
    """(pid, address) of a ServerEndpoint serving in a process of its own; with `open_files`,
    a process that may open no more files than that (its soft and hard limit)."""

    def limit() -> None:
        if open_files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

    child = subprocess.Popen(
        [sys.executable, "-c", _ENDPOINT_PROCESS, secret.hex(), "on" if encrypt else "off"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=limit,
    )
    try:
        assert child.stdout is not None
        yield child.pid, child.stdout.readline().strip()
    finally:
        child.kill()
        child.wait(10)


# ---- a raw ZMTP peer that never finishes its message ------------------------------------------
def _greeting(mechanism: bytes) -> bytes:
    """A ZMTP 3.0 greeting: signature, version 3.0, mechanism, as-server 0, filler."""
    return b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + mechanism.ljust(20, b"\0") + bytes(32)


def _ready(socket_type: bytes) -> bytes:
    """The NULL mechanism's READY command, naming the peer's socket type."""
    name = b"Socket-Type"
    body = b"\x05READY" + bytes([len(name)]) + name + len(socket_type).to_bytes(4, "big")
    body += socket_type
    return b"\x04" + bytes([len(body)]) + body


def _frame(body: bytes) -> bytes:
    return b"\x00" + bytes([len(body)]) + body  # a short, final message frame


def _plain_peer(address: str, secret: bytes | None) -> tuple[socket.socket, Callable[[], None]]:
    """A raw DEALER with the NULL mechanism (with `secret`, past ember's handshake too), and
    how it sends one more frame of a message that never ends."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    peer = socket.create_connection((host, int(port)), timeout=10)
    frame = b"\x03" + FRAME_BYTES.to_bytes(8, "big") + bytes(FRAME_BYTES)  # MORE | LONG
    try:
        peer.sendall(_greeting(b"NULL"))
        recv_exact(peer, 64)
        peer.sendall(_ready(b"DEALER"))
        if secret is not None:
            while not read_frame(peer)[0] & 0x04:  # the server's READY command
                pass
            send = lambda body: peer.sendall(_frame(body))  # noqa: E731
            open_session(address, secret, send, lambda: read_frame(peer)[1])
    except OSError:
        pass  # refused already: what the sender finds out
    return peer, lambda: peer.sendall(frame)


def _curve_peer(address: str, secret: bytes) -> tuple[socket.socket, Callable[[], None]]:
    """A raw CURVE DEALER holding the run's keys, past ember's handshake, and how it sends
    one more frame of a message that never ends."""
    peer = CurvePeer(address, secret)
    open_session(address, secret, peer.send, peer.recv)
    payload = bytes(FRAME_BYTES - 64)  # with CURVE's framing, under the largest frame
    return peer.sock, lambda: peer.send(payload, more=True)


def unfinished_message(
    address: str,
    total: int,
    on_frame: Callable[[int], object] | None = None,
    secret: bytes | None = None,
    encrypt: bool = False,
) -> tuple[int, bool]:
    """Speak ZMTP 3 by hand as a DEALER, then send `total` bytes of one multipart message
    whose frames all carry MORE, so it never ends: a pyzmq sender could not, since it drains
    its own messages. Without `secret`, with the NULL mechanism; with it, as a worker
    holding the run's secret past ember's handshake, over CURVE with `encrypt`. Returns
    (bytes sent, whether the server dropped the connection). Bounded by `total` and
    ATTACK_SECONDS."""
    deadline = time.monotonic() + ATTACK_SECONDS
    if secret is not None and encrypt:
        peer, send_frame = _curve_peer(address, secret)
    else:
        peer, send_frame = _plain_peer(address, secret)
    sent = 0
    with peer:
        try:
            while sent < total and time.monotonic() < deadline:
                send_frame()
                sent += FRAME_BYTES
                if on_frame is not None:
                    on_frame(sent)
        except (BrokenPipeError, ConnectionResetError):
            return sent, True
        except TimeoutError:
            pass  # the server takes no more: it closed its end, or it holds what it has
        # Dropped only if the server has closed its end by now (a closed end that still
        # advertises no room leaves a sender blocked, not refused).
        return sent, dropped(peer, 2.0)


def attack(encrypt: bool, secret: bytes, total: int, keyed: bool = False) -> tuple[int, int, bool]:
    """(server RSS growth, bytes sent, dropped) for one unfinished message of `total` bytes
    sent to an endpoint in a process of its own; `keyed`: by a peer holding the secret,
    past ember's handshake (with `encrypt`, a raw CURVE client holding the run's keys)."""
    with endpoint_process(encrypt, secret) as (pid, address):
        before = peak = settled_rss(pid)  # imports settled: what grows now is the peer's doing

        def watch(_sent: int) -> None:
            nonlocal peak
            peak = max(peak, rss(pid))

        keys = secret if keyed else None
        sent, was_dropped = unfinished_message(address, total, watch, keys, encrypt)
        time.sleep(0.5)
        peak = max(peak, rss(pid))
        return peak - before, sent, was_dropped


# ---- raw peers that speak CURVE's framing without the keys ------------------------------------
def handshake_holder(address: str, command_bytes: int) -> socket.socket:
    """A raw peer that greets as a CURVE client, then sends all but the last byte of a
    handshake command of `command_bytes` and keeps the connection open: what it sent is
    held until the server drops it. The caller closes the socket."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    peer = socket.create_connection((host, int(port)), timeout=10)
    try:
        peer.sendall(_greeting(b"CURVE"))
        recv_exact(peer, 64)
        body = b"\x05HELLO" + bytes(command_bytes - 6)
        peer.sendall(b"\x06" + len(body).to_bytes(8, "big") + body[:-1])  # COMMAND | LONG
    except OSError:
        pass  # dropped already: what dropped() reports
    return peer


def hold_handshakes(pid: int, address: str, count: int) -> tuple[int, int, int]:
    """(peak RSS growth of server process `pid`, holders, how many the server dropped) for
    `count` handshake holders of 1 MiB each, opened one after another (for ATTACK_SECONDS at
    most) and held together."""
    held: list[socket.socket] = []
    before = peak = settled_rss(pid)  # imports settled: what grows now is the holders' doing
    deadline = time.monotonic() + ATTACK_SECONDS
    try:
        while len(held) < count and time.monotonic() < deadline:
            held.append(handshake_holder(address, MiB))
            peak = max(peak, rss(pid))
        time.sleep(0.5)
        peak = max(peak, rss(pid))
        gone = sum(dropped(peer, 5 if index < 100 else 0.2) for index, peer in enumerate(held))
    finally:
        for peer in held:
            peer.close()
    return peak - before, len(held), gone


def idle_greeter(address: str) -> socket.socket:
    """A raw peer that sends a CURVE greeting and nothing more; the caller closes it."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    peer = socket.create_connection((host, int(port)), timeout=10)
    with contextlib.suppress(OSError):
        peer.sendall(_greeting(b"CURVE"))
    return peer


def dropped(peer: socket.socket, seconds: float) -> bool:
    """Whether the server closes `peer`'s connection within `seconds` (what it sends before
    is read and ignored)."""
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            peer.settimeout(max(0.01, deadline - time.monotonic()))
            if not peer.recv(1 << 16):
                return True
    except TimeoutError:
        return False
    except OSError:
        return True
    return False


# ---- peers with some of the keys, or all of them ----------------------------------------------
def keyed_socket(context: zmq.Context, secret: bytes, encrypt: bool = True) -> zmq.Socket:
    """A DEALER holding the run's transport keys (as a worker would), that speaks nothing
    by itself: the caller says what it sends."""
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if encrypt:
        curve.secure_client(sock, secret)
    return sock


def open_session_by_hand(sock: zmq.Socket, secret: bytes, wait: float = 10.0) -> bytes:
    """ember's handshake on a connected DEALER; the session key."""
    client_nonce = os.urandom(NONCE_BYTES)
    sock.send(HELLO + client_nonce)
    assert sock.poll(int(wait * 1000)), "no CHALLENGE"
    challenge = sock.recv()
    nonces = challenge[-NONCE_BYTES:] + client_nonce
    sock.send(PROOF + mac(secret, b"proof", nonces))
    assert sock.poll(int(wait * 1000)), "no answer to the PROOF"
    assert sock.recv().startswith(WELCOME)
    return mac(secret, b"session", nonces)


class Polling:
    """An endpoint polled on a thread of its own (a handshake needs the server answering);
    `take(seconds)` returns what it handed out meanwhile. It stops after 120 s whatever
    happens."""

    def __init__(self, endpoint: ServerEndpoint) -> None:
        self.endpoint = endpoint
        self._events: list[Request | Chunk] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + 120
        while not self._stop.is_set() and time.monotonic() < deadline:
            event = self.endpoint.poll(0.05)
            if event is not None:
                self._events.append(event)

    def take(self, seconds: float) -> list[Request | Chunk]:
        time.sleep(seconds)
        out, self._events = self._events, []
        return out

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def flood_peer(context: zmq.Context, server_key: bytes) -> zmq.Socket:
    """A peer that knows the server's public key (more than one without the secret could)
    but holds a key pair of its own, and says the HMAC HELLO."""
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    public, secret = zmq.curve_keypair()
    sock.setsockopt(zmq.CURVE_SERVERKEY, server_key)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
    return sock


def slow_reader_socket(context: zmq.Context, kind: int) -> zmq.Socket:
    """A DEALER that takes at most one message off its TCP connection until it is read, so
    what the server sends it stays queued in the server (patched over wire.connection's
    new_socket while a slow reader's connection opens)."""
    sock = sockets.new_socket(context, kind)
    sock.setsockopt(zmq.RCVHWM, 1)
    sock.setsockopt(zmq.RCVBUF, 64 << 10)
    return sock


def join_and_leave(connection: ClientConnection, worker: int) -> None:
    """Register `worker` as a joiner would, and say it is done."""
    base: dict[str, Any] = {"worker": worker, "incarnation": 0, "clock": 0}
    connection.send({"op": "register", "seq": 1, "step": 0, **base})
    assert connection.recv()[0]["op"] == "ok"
    connection.send({"op": "done", "seq": 2, **base})
    assert connection.recv()[0] == {"op": "ok"}


def hello_flood(
    context: zmq.Context,
    address: str,
    server_key: bytes,
    peers: int,
    wave: int,
    refused: Callable[[], int],
    started: Callable[[], object] = lambda: None,
) -> None:
    """`peers` identities in waves of `wave`, each saying HELLO with a key pair the server does
    not know; each wave waits (up to 30 s) until `refused()` counts it, then closes."""
    first = refused()
    for start in range(0, peers, wave):
        socks = [flood_peer(context, server_key) for _ in range(wave)]
        for sock in socks:
            sock.connect(address)
            # The HELLO waits for a handshake that ZAP refuses; a pipe libzmq has not made
            # yet takes nothing, and the connection is refused all the same.
            with contextlib.suppress(zmq.Again):
                sock.send(b"EMBER2-HELLO" + os.urandom(32), zmq.NOBLOCK)
        started()
        deadline = time.monotonic() + 30
        while refused() < first + start + wave and time.monotonic() < deadline:
            time.sleep(0.01)
        for sock in socks:
            sock.close(linger=0)


def unread_pulls(
    address: str, pid: int, secret: bytes, keys: int, requests: int
) -> tuple[int, PSClient, PSClient]:
    """A slow reader (worker 0, on slow_reader_socket) sends `requests` pulls and reads none,
    while an honest worker (1) pushes and pulls between them, so each of its updates moves the
    shard to a private copy a pull's reply still reads. Payloads on the socket (set
    EMBER_SHARED_MEMORY=0). Returns (peak RSS growth of process `pid`, honest, slow reader)."""
    values = np.full(keys, 1e-3, dtype=np.float32)
    pulled = np.empty(keys, dtype=np.float32)
    honest = PSClient([address], secret, worker=1, timeout=10)
    honest.register()
    for _ in range(3):  # the server's buffers for an exchange are in place
        honest.push(values, reply_into=pulled, pull=True)
    original = connection.new_socket
    connection.new_socket = slow_reader_socket
    try:
        slow = PSClient([address], secret, worker=0, timeout=10)
    finally:
        connection.new_socket = original
    slow.register()
    before = peak = rss(pid)
    for _ in range(requests):
        slow.seq += 1
        slow.connections[0].send(slow._message("pull", 0, None, {}).header())
        honest.push(values, reply_into=pulled, pull=True)
        peak = max(peak, rss(pid))
    return peak - before, honest, slow
