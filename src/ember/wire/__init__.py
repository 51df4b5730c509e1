"""The wire: the only ember code that imports zmq.

Map:
- ServerEndpoint  -> channel.py: authenticated ROUTER socket, HMAC handshake, sealed replies
- ClientConnection -> channel.py: authenticated DEALER connection with timeouts
- Request         -> channel.py: an authenticated request (peer, header, payload frames)
- seal / unseal   -> frames.py: HMAC-SHA256 + msgpack header frames
- tensors_from_frames / gather -> frames.py: validated zero-copy tensor chunk views
- shared            -> shared.py: same-host payloads through a shared-memory region
- CONNECTION_ERRORS -> channel.py: what a connection raises when its peer is down or misbehaves
- SendTicket        -> ticket.py: when a zero-copy reply no longer reads its buffers
"""

from ember.wire import shared
from ember.wire.channel import (
    CONNECTION_ERRORS,
    Chunk,
    ClientConnection,
    Request,
    ServerEndpoint,
)
from ember.wire.frames import CHUNK_BYTES, gather, seal, tensors_from_frames, unseal
from ember.wire.ticket import SendTicket

__all__ = [
    "CHUNK_BYTES",
    "CONNECTION_ERRORS",
    "Chunk",
    "ClientConnection",
    "Request",
    "SendTicket",
    "ServerEndpoint",
    "gather",
    "seal",
    "shared",
    "tensors_from_frames",
    "unseal",
]
