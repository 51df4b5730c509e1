"""The wire: the only ember code that imports zmq.

Map:
- ServerEndpoint    -> endpoint.py: authenticated ROUTER socket, streamed requests, sealed replies
- Request / Chunk   -> endpoint.py: an authenticated request, and one of its payload frames
- ClientConnection  -> connection.py: authenticated DEALER connection with timeouts
- CONNECTION_ERRORS -> connection.py: what a connection raises when its peer is down or misbehaves
- ServerHandshake / open_session -> handshake.py: HMAC handshake and per-connection session key
- use_encryption / warn_if_exposed -> curve.py: CURVE keys from the run's secret, the ZAP handler
- endpoint_is_local -> hosts.py: whether an address stays on this host (loopback, ipc)
- new_socket / use_io_threads -> sockets.py: socket options, the largest frame a socket
  accepts, and a process's I/O threads
- seal / unseal     -> frames.py: HMAC-SHA256 + msgpack header frames
- BulkSealer / BulkOpener -> bulk_cipher.py: AEAD bulk frames, keys from the session key
- BulkChannel / ServerChannels -> bulk.py: a connection's sealer, opener and buffers (aead)
- use_wire_cipher   -> curve.py: "curve" or "aead", what encrypts when encryption is on
- lanes.py: a connection striped over several sockets; use_wire_lanes / probe -> striping.py:
  how many
- tensors_from_frames / gather -> frames.py: validated zero-copy tensor chunk views
- shared            -> shared.py: same-host payloads through a shared-memory region
- SendTicket        -> ticket.py: when a zero-copy reply no longer reads its buffers
- channel.py        -> re-exports the endpoints' names and the handshake tags

imports: errors
"""

from ember.wire import shared
from ember.wire.connection import CONNECTION_ERRORS, ClientConnection
from ember.wire.curve import use_encryption, warn_if_exposed
from ember.wire.endpoint import Chunk, Request, ServerEndpoint
from ember.wire.frames import CHUNK_BYTES, gather, seal, tensors_from_frames, unseal
from ember.wire.hosts import endpoint_is_local
from ember.wire.sockets import server_io_threads, use_io_threads
from ember.wire.striping import LaneChoice, probe, use_wire_lanes, wire_lanes
from ember.wire.ticket import SendTicket

__all__ = [
    "CHUNK_BYTES",
    "CONNECTION_ERRORS",
    "Chunk",
    "ClientConnection",
    "LaneChoice",
    "Request",
    "SendTicket",
    "ServerEndpoint",
    "endpoint_is_local",
    "gather",
    "probe",
    "seal",
    "server_io_threads",
    "shared",
    "tensors_from_frames",
    "unseal",
    "use_encryption",
    "use_io_threads",
    "use_wire_lanes",
    "warn_if_exposed",
    "wire_lanes",
]
