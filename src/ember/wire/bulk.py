"""One connection's end of the AEAD bulk frames: the sealer, opener and buffers that payload
chunks go through when the wire cipher (curve.use_wire_cipher) is "aead".

With "aead" the socket's ZMTP mechanism is NULL: the HMAC handshake (handshake.py) proves the
run's secret and makes the session key, headers stay HMAC-sealed msgpack (readable on the
wire, never forgeable), and every payload chunk is an AEAD frame (bulk_cipher.py) whose keys
come from that session key. A chunk's associated data is its header's MAC and its index in
the message, so a frame cannot be moved to another message or place; the opener's counter
refuses one replayed, reordered or dropped.
"""

from __future__ import annotations

import numpy as np

from ember.wire import curve
from ember.wire.bulk_cipher import FRAME_LIMIT as KEY_FRAMES
from ember.wire.bulk_cipher import (
    MAX_PAYLOAD,
    OVERHEAD,
    BulkFrameRefused,
    BulkOpener,
    BulkSealer,
    derive_bulk_keys,
    preferred_cipher,
)
from ember.wire.frames import CHUNK_BYTES, MAC_BYTES
from ember.wire.shared import SharedFrame

FRAME_LIMIT = KEY_FRAMES  # read as each channel opens, so a test can make keys ratchet often


def bulk_cipher(encrypted: bool, override: str | None = None) -> str | None:
    """The AEAD cipher a connection seals its chunks with, or None when they are not sealed
    (encryption off, or CURVE encrypting them); `override`: "curve" or "aead"."""
    name = curve.wire_cipher(override)
    return preferred_cipher() if encrypted and name == "aead" else None


def chunk_aad(header_frame: bytes | memoryview, index: int) -> bytes:
    """A chunk's associated data: the MAC of its message's header, and its index there."""
    return bytes(header_frame[:MAC_BYTES]) + index.to_bytes(4, "big")


class BulkChannel:
    """One end's sealer and opener for a connection, with a scratch buffer for opening.
    Not thread-safe: one owner, as the connection it belongs to."""

    def __init__(self, session_key: bytes, role: str, cipher: str) -> None:
        self.sealer: BulkSealer
        self.opener: BulkOpener
        self.sealer, self.opener = derive_bulk_keys(
            session_key, role, cipher, frame_limit=FRAME_LIMIT
        )
        self.inbox = memoryview(bytearray(CHUNK_BYTES))  # a frame opened, then copied out

    @property
    def refused(self) -> int:
        return self.opener.refused

    def seal_new(self, chunk: memoryview, aad: bytes) -> memoryview:
        """The frame for `chunk` in a buffer of its own, for a zero-copy send. The buffer is
        left uninitialised (np.empty): the cipher writes every byte of it, and zeroing a
        bytearray first cost a fifth of the sealing."""
        out = np.empty(memoryview(chunk).nbytes + OVERHEAD, np.uint8).data
        self.sealer.seal_into(chunk, out, aad)
        return out

    def open(self, frame: memoryview, aad: bytes, out: memoryview | None = None) -> SharedFrame:
        """Check and decrypt `frame` into `out` (by default a buffer of its own), which holds
        only zeros if the frame is refused (BulkFrameRefused, and the opener stays closed)."""
        size = min(MAX_PAYLOAD, max(0, memoryview(frame).nbytes - OVERHEAD))
        place = np.empty(size, np.uint8).data if out is None else out
        return SharedFrame(place[: self.opener.open_into(frame, place, aad)])


class ServerChannels:
    """A server's BulkChannel per authenticated peer."""

    def __init__(self, cipher: str | None) -> None:
        self.cipher = cipher
        self._channels: dict[bytes, BulkChannel] = {}

    @property
    def overhead(self) -> int:
        """Bytes a sealed frame adds to its chunk."""
        return 0 if self.cipher is None else OVERHEAD

    def opened(self, peer: bytes, session_key: bytes) -> None:
        if self.cipher is not None:
            self._channels[peer] = BulkChannel(session_key, "server", self.cipher)

    def open(self, peer: bytes, frame: memoryview, header_frame: bytes, index: int) -> object:
        """Chunk `index` of the request whose header frame is `header_frame`, checked and
        decrypted into a buffer of its own (the server keeps a request's chunks until it has
        applied them all). BulkFrameRefused, and the peer's channel goes, when it fails."""
        channel = self._channels.get(peer)
        if channel is None:
            raise BulkFrameRefused("bulk frame refused: the connection's keys are gone")
        try:
            return channel.open(frame, chunk_aad(header_frame, index))
        except BulkFrameRefused:
            self.drop(peer)
            raise

    def binding(self, header_frame: bytes | memoryview) -> bytes:
        """What of a request's header frame its bulk frames are bound to (its MAC)."""
        return b"" if self.cipher is None else bytes(header_frame[:MAC_BYTES])

    def seal(self, peer: bytes, chunk: memoryview, binding: bytes, index: int) -> memoryview | None:
        """Chunk `index` of a reply whose header's MAC is `binding`, sealed for `peer` in a
        buffer of its own, for a zero-copy send; None when chunks go as they are, and empty
        when the peer's keys are gone."""
        if self.cipher is None:
            return None
        channel = self._channels.get(peer)
        if channel is None:
            return memoryview(b"")
        return channel.seal_new(chunk, chunk_aad(binding, index))

    def drop(self, peer: bytes) -> None:
        self._channels.pop(peer, None)
