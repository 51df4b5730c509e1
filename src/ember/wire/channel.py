"""ZeroMQ endpoints: an authenticated ROUTER for servers, a DEALER connection for clients."""

from __future__ import annotations

import hmac
import os
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from ember.errors import ProtocolError, ServerUnavailable
from ember.wire.frames import (
    CHUNK_BYTES,
    MAC_BYTES,
    MAX_HEADER_BYTES,
    chunk_frames,
    describe,
    mac,
    seal,
    unseal,
)

HELLO, CHALLENGE, PROOF = b"EMBER1-HELLO", b"EMBER1-CHALLENGE", b"EMBER1-PROOF"
WELCOME, DENIED = b"EMBER1-OK", b"EMBER1-DENIED"
NONCE_BYTES = 32
MAX_PENDING_HANDSHAKES = 1024
# A frame is a header or one tensor chunk; anything larger makes zmq drop the peer before
# the bytes are buffered, so an oversized length never reaches an allocation of ours.
MAX_FRAME_BYTES = max(CHUNK_BYTES, MAC_BYTES + MAX_HEADER_BYTES) + 1024


def _socket(context: zmq.Context, kind: int) -> zmq.Socket:
    sock = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
    sock.setsockopt(zmq.SNDBUF, 4 << 20)
    sock.setsockopt(zmq.RCVBUF, 4 << 20)
    return sock


@dataclass
class Request:
    """An authenticated request: `frames` are zmq Frames whose buffers the payload views alias."""

    peer: bytes
    header: dict[str, Any]
    frames: list[Any]


class ServerEndpoint:
    """A ROUTER socket that serves only peers that proved they hold the run's secret.

    Handshake (raw frames, nothing parsed before it succeeds): HELLO + client nonce ->
    CHALLENGE + server nonce -> PROOF = HMAC(secret, "proof" | sn | cn) -> OK + HMAC(secret,
    "server" | sn | cn). Each header afterwards is sealed with the per-connection key
    HMAC(secret, "session" | sn | cn), so a frame replayed on another connection fails its MAC.
    """

    def __init__(
        self, secret: bytes, bind: str = "tcp://127.0.0.1:0", context: zmq.Context | None = None
    ) -> None:
        self._secret = secret
        self._context = context or zmq.Context.instance()
        self._sock = _socket(self._context, zmq.ROUTER)
        self._sock.bind(bind)
        self.address: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._pending: OrderedDict[bytes, bytes] = OrderedDict()  # peer -> nonces sn|cn
        self._sessions: dict[bytes, bytes] = {}  # peer -> session key
        self.rejected: Counter[str] = Counter()

    def poll(self, timeout: float) -> Request | None:
        """Wait up to `timeout` seconds; return the next authenticated request, if any."""
        if not self._sock.poll(int(timeout * 1000), zmq.POLLIN):
            return None
        frames = self._sock.recv_multipart(copy=False)
        peer = frames[0].bytes
        try:
            return self._accept(peer, frames[1:])
        except ProtocolError as exc:
            self.rejected[_reason(exc)] += 1
            return None

    def _accept(self, peer: bytes, frames: list[Any]) -> Request | None:
        if not frames:
            raise ProtocolError("empty message")
        key = self._sessions.get(peer)
        if key is None:
            self._handshake(peer, frames)
            return None
        header = unseal(key, frames[0].buffer)
        return Request(peer, header, frames[1:])

    def _handshake(self, peer: bytes, frames: list[Any]) -> None:
        tag = frames[0].bytes if len(frames) == 2 else b""
        if tag == HELLO and len(frames[1]) == NONCE_BYTES:
            nonces = os.urandom(NONCE_BYTES) + frames[1].bytes
            self._pending[peer] = nonces
            while len(self._pending) > MAX_PENDING_HANDSHAKES:
                self._pending.popitem(last=False)
            self._sock.send_multipart([peer, CHALLENGE, nonces[:NONCE_BYTES]])
            return
        nonces = self._pending.get(peer)
        if tag == PROOF and nonces is not None:
            if not hmac.compare_digest(frames[1].bytes, mac(self._secret, b"proof", nonces)):
                del self._pending[peer]
                self._sock.send_multipart([peer, DENIED, b""])  # fail fast, reveal nothing
                raise ProtocolError("unauthenticated: wrong secret")
            del self._pending[peer]
            self._sessions[peer] = mac(self._secret, b"session", nonces)
            self._sock.send_multipart([peer, WELCOME, mac(self._secret, b"server", nonces)])
            return
        raise ProtocolError("unauthenticated: message before a completed handshake")

    def reply(
        self,
        request: Request,
        header: dict[str, Any],
        arrays: Sequence[np.ndarray] = (),
        track: bool = False,
    ) -> zmq.MessageTracker | None:
        """Send a sealed reply. Arrays go zero-copy: with `track`, the returned tracker says when
        zmq no longer reads them; the caller must not modify them before that."""
        key = self._sessions.get(request.peer)
        if key is None:
            return None
        if arrays:
            header = {**header, "tensors": describe(arrays)}
        frames: list[Any] = [request.peer, seal(key, header), *chunk_frames(arrays)]
        if not (track and arrays):
            self._sock.send_multipart(frames, copy=False)
            return None
        # send_multipart would track only the last frame; every frame must be tracked.
        trackers = [
            self._sock.send(frame, zmq.SNDMORE, copy=False, track=True) for frame in frames[:-1]
        ]
        trackers.append(self._sock.send(frames[-1], 0, copy=False, track=True))
        return zmq.MessageTracker(*trackers)

    def forget(self, peer: bytes) -> None:
        self._sessions.pop(peer, None)

    def close(self) -> None:
        self._sock.close(linger=0)


class ClientConnection:
    """One authenticated DEALER connection to a server; not thread-safe (one owner thread)."""

    def __init__(
        self, address: str, secret: bytes, timeout: float, context: zmq.Context | None = None
    ) -> None:
        self.address = address
        self.timeout = timeout
        self._context = context or zmq.Context.instance()
        self._sock = _socket(self._context, zmq.DEALER)
        self._sock.connect(address)
        self._key = self._handshake(secret)

    def _handshake(self, secret: bytes) -> bytes:
        client_nonce = os.urandom(NONCE_BYTES)
        self._sock.send_multipart([HELLO, client_nonce])
        tag, server_nonce = self._recv_raw()
        if tag != CHALLENGE or len(server_nonce) != NONCE_BYTES:
            raise ProtocolError(f"server at {self.address} sent a malformed challenge")
        nonces = server_nonce + client_nonce
        self._sock.send_multipart([PROOF, mac(secret, b"proof", nonces)])
        tag, proof = self._recv_raw()
        if tag == DENIED:
            raise ProtocolError(f"server at {self.address} refused the run's secret")
        if tag != WELCOME or not hmac.compare_digest(proof, mac(secret, b"server", nonces)):
            raise ProtocolError(f"server at {self.address} did not prove it holds the secret")
        return mac(secret, b"session", nonces)

    def _recv_raw(self) -> list[bytes]:
        if not self._sock.poll(int(self.timeout * 1000), zmq.POLLIN):
            raise ServerUnavailable(
                f"parameter server at {self.address} did not answer within {self.timeout:g}s "
                "(wrong secret, or the server is not running)"
            )
        frames = self._sock.recv_multipart()
        if len(frames) != 2:
            raise ProtocolError(f"server at {self.address} sent {len(frames)} handshake frames")
        return frames

    def send(self, header: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> None:
        """Send zero-copy: the arrays must stay alive and unmodified until the reply arrives."""
        if arrays:
            header = {**header, "tensors": describe(arrays)}
        self._sock.send_multipart([seal(self._key, header), *chunk_frames(arrays)], copy=False)

    def recv(self, timeout: float | None = None) -> tuple[dict[str, Any], list[Any]]:
        """Next reply as (header, payload frames); payload views alias the frames."""
        wait = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        if not self._sock.poll(max(0, int((deadline - time.monotonic()) * 1000)), zmq.POLLIN):
            raise ServerUnavailable(
                f"parameter server at {self.address} did not answer within {wait:g}s"
            )
        frames = self._sock.recv_multipart(copy=False)
        header = unseal(self._key, frames[0].buffer)
        if header["op"] == "error":
            raise ProtocolError(
                f"server at {self.address} refused the request: "
                f"{header.get('message', 'no reason given')}"
            )
        return header, frames[1:]

    def close(self) -> None:
        self._sock.close(linger=0)


def _reason(exc: ProtocolError) -> str:
    text = str(exc)
    for reason in ("unauthenticated", "HMAC", "msgpack", "size", "map"):
        if reason in text:
            return reason.lower()
    return "malformed"
