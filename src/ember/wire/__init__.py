"""The wire: the only ember code that imports zmq.

Map:
- ServerEndpoint  -> channel.py: authenticated ROUTER socket, HMAC handshake, sealed replies
- ClientConnection -> channel.py: authenticated DEALER connection with timeouts
- Request         -> channel.py: an authenticated request (peer, header, payload frames)
- seal / unseal   -> frames.py: HMAC-SHA256 + msgpack header frames
- tensors_from_frames / gather -> frames.py: validated zero-copy tensor chunk views
- shared            -> shared.py: same-host payloads through a shared-memory region
"""

from ember.wire import shared
from ember.wire.channel import Chunk, ClientConnection, Request, ServerEndpoint
from ember.wire.frames import CHUNK_BYTES, gather, seal, tensors_from_frames, unseal

__all__ = [
    "CHUNK_BYTES",
    "Chunk",
    "ClientConnection",
    "Request",
    "ServerEndpoint",
    "gather",
    "seal",
    "shared",
    "tensors_from_frames",
    "unseal",
]
