"""The HMAC handshake that opens a connection, and the session key it derives for it."""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable

import zmq

from ember.errors import ProtocolError
from ember.wire.frames import mac

# Handshake messages are raw bytes, a tag followed by 32 bytes (a nonce or a MAC), so nothing
# is parsed before a peer has proved the secret: HELLO | client nonce -> CHALLENGE | server
# nonce -> PROOF | HMAC(secret, "proof" | sn | cn) -> OK | HMAC(secret, "server" | sn | cn).
# Each header afterwards is sealed with the per-connection key HMAC(secret, "session" | sn |
# cn), so a frame replayed on another connection fails its MAC.
HELLO, CHALLENGE, PROOF = b"EMBER2-HELLO", b"EMBER2-CHALLENGE", b"EMBER2-PROOF"
WELCOME, DENIED = b"EMBER2-OK", b"EMBER2-DENIED"
NONCE_BYTES = 32
# Peers whose one handshake is under way or spent, a backstop: an entry goes when its
# connection closes (peers.py ends one that has not authenticated in time), so only a
# transport without connections (inproc) could fill it, and then newcomers are refused.
MAX_PENDING_HANDSHAKES = 1 << 16


class ServerHandshake:
    """The server's side: answers each step on its ROUTER socket. A connection gets one
    CHALLENGE, ever: whatever else it sends before proving the secret is refused unanswered,
    so a peer cannot make the server queue replies it never reads, and its nonces are kept
    until its connection closes, so no other peer's handshakes can push them out."""

    def __init__(self, secret: bytes, sock: zmq.Socket) -> None:
        self._secret = secret
        self._sock = sock
        self._pending: dict[bytes, bytes | None] = {}  # peer -> nonces sn|cn; None once spent

    @property
    def pending(self) -> int:
        return len(self._pending)

    def admit(self, peer: bytes, data: bytes) -> bytes | None:
        """Answer one handshake message from `peer`: its session key once it has proved the
        secret, else None. A wrong proof or a message out of turn raises ProtocolError."""
        tag, value = _split(data)
        if tag == HELLO and peer not in self._pending:
            if len(self._pending) >= MAX_PENDING_HANDSHAKES:
                raise ProtocolError("unauthenticated: too many handshakes under way")
            fresh = os.urandom(NONCE_BYTES) + value
            self._pending[peer] = fresh
            self._sock.send_multipart([peer, CHALLENGE + fresh[:NONCE_BYTES]])
            return None
        nonces = self._pending.get(peer)
        if tag == PROOF and nonces is not None:
            self._pending[peer] = None
            if not hmac.compare_digest(value, mac(self._secret, b"proof", nonces)):
                self._sock.send_multipart([peer, DENIED + bytes(NONCE_BYTES)])  # fail fast
                raise ProtocolError("unauthenticated: wrong secret")
            del self._pending[peer]
            key = mac(self._secret, b"session", nonces)
            self._sock.send_multipart([peer, WELCOME + mac(self._secret, b"server", nonces)])
            return key
        raise ProtocolError("unauthenticated: message before a completed handshake")

    def forget(self, peer: bytes) -> None:
        """`peer`'s connection closed."""
        self._pending.pop(peer, None)


def open_session(
    address: str, secret: bytes, send: Callable[[bytes], object], receive: Callable[[], bytes]
) -> bytes:
    """The client's side: prove the secret to the server at `address` through `send` and
    `receive`, check that the server proves it back, and return the session key."""
    client_nonce = os.urandom(NONCE_BYTES)
    send(HELLO + client_nonce)
    tag, server_nonce = _split(receive())
    if tag != CHALLENGE:
        raise ProtocolError(f"server at {address} sent a malformed challenge")
    nonces = server_nonce + client_nonce
    send(PROOF + mac(secret, b"proof", nonces))
    tag, proof = _split(receive())
    if tag == DENIED:
        raise ProtocolError(f"server at {address} refused the run's secret")
    if tag != WELCOME or not hmac.compare_digest(proof, mac(secret, b"server", nonces)):
        raise ProtocolError(f"server at {address} did not prove it holds the secret")
    return mac(secret, b"session", nonces)


def _split(data: bytes) -> tuple[bytes, bytes]:
    return data[:-NONCE_BYTES], data[-NONCE_BYTES:]  # (tag, nonce or MAC)
