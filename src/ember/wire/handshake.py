"""The HMAC handshake that opens a connection, and the session key it derives for it."""

from __future__ import annotations

import hmac
import os
from collections import OrderedDict
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
MAX_PENDING_HANDSHAKES = 1024


class ServerHandshake:
    """The server's side: answers each step on its ROUTER socket, keeping the nonces of at
    most MAX_PENDING_HANDSHAKES peers that said HELLO and have not proved the secret yet."""

    def __init__(self, secret: bytes, sock: zmq.Socket) -> None:
        self._secret = secret
        self._sock = sock
        self._pending: OrderedDict[bytes, bytes] = OrderedDict()  # peer -> nonces sn|cn

    def admit(self, peer: bytes, data: bytes) -> bytes | None:
        """Answer one handshake message from `peer`: its session key once it has proved the
        secret, else None. A wrong proof or a message out of turn raises ProtocolError."""
        tag, value = _split(data)
        if tag == HELLO:
            nonces = os.urandom(NONCE_BYTES) + value
            self._pending[peer] = nonces
            while len(self._pending) > MAX_PENDING_HANDSHAKES:
                self._pending.popitem(last=False)
            self._sock.send_multipart([peer, CHALLENGE + nonces[:NONCE_BYTES]])
            return None
        saved = self._pending.get(peer)
        if tag == PROOF and saved is not None:
            nonces = saved
            del self._pending[peer]
            if not hmac.compare_digest(value, mac(self._secret, b"proof", nonces)):
                self._sock.send_multipart([peer, DENIED + bytes(NONCE_BYTES)])  # fail fast
                raise ProtocolError("unauthenticated: wrong secret")
            key = mac(self._secret, b"session", nonces)
            self._sock.send_multipart([peer, WELCOME + mac(self._secret, b"server", nonces)])
            return key
        raise ProtocolError("unauthenticated: message before a completed handshake")


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
