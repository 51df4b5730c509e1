"""The endpoints, handshake tags and frame limits, importable under the name they had here."""

from ember.wire.connection import CONNECTION_ERRORS, WATCH_SLICE, ClientConnection
from ember.wire.endpoint import Chunk, Request, ServerEndpoint
from ember.wire.frames import MAX_REPLY_BYTES
from ember.wire.handshake import (
    CHALLENGE,
    DENIED,
    HELLO,
    MAX_PENDING_HANDSHAKES,
    NONCE_BYTES,
    PROOF,
    WELCOME,
)
from ember.wire.sockets import MAX_FRAME_BYTES

__all__ = [
    "CHALLENGE",
    "CONNECTION_ERRORS",
    "DENIED",
    "HELLO",
    "MAX_FRAME_BYTES",
    "MAX_PENDING_HANDSHAKES",
    "MAX_REPLY_BYTES",
    "NONCE_BYTES",
    "PROOF",
    "WATCH_SLICE",
    "WELCOME",
    "Chunk",
    "ClientConnection",
    "Request",
    "ServerEndpoint",
]
