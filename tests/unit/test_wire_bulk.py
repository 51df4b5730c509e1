"""A connection's end of the AEAD bulk frames (wire/bulk.py): which cipher a process seals
with, channels that open what the other end sealed and nothing else, and a server that never
sends a payload chunk in clear once a peer's keys are gone."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest

from ember.wire import bulk, curve
from ember.wire.bulk_cipher import OVERHEAD, BulkFrameRefused, preferred_cipher

HEADER = os.urandom(32) + b"msgpack body"
CIPHER = preferred_cipher()


@pytest.fixture
def aead() -> Iterator[None]:
    before = curve.wire_cipher()
    curve.use_wire_cipher("aead")
    try:
        yield
    finally:
        curve.use_wire_cipher(before)


def _pair(session: bytes | None = None) -> tuple[bulk.BulkChannel, bulk.BulkChannel]:
    key = session or os.urandom(32)
    return bulk.BulkChannel(key, "client", CIPHER), bulk.BulkChannel(key, "server", CIPHER)


def test_aead_frames_are_sealed_only_when_encryption_is_on_and_aead_is_chosen(aead) -> None:
    assert bulk.bulk_cipher(True) == CIPHER
    assert bulk.bulk_cipher(False) is None  # --encrypt off: nothing is sealed
    assert bulk.bulk_cipher(True, "curve") is None  # CURVE encrypts the chunks instead
    with pytest.raises(ValueError, match="wire cipher must be one of"):
        curve.use_wire_cipher("rot13")
    assert curve.wire_cipher() == "aead"


def test_a_chunk_sealed_by_one_end_opens_at_the_other_into_a_buffer_of_its_own() -> None:
    client, server = _pair()
    chunk = np.arange(1000, dtype=np.float32)
    frame = bytes(client.seal_new(memoryview(chunk).cast("B"), bulk.chunk_aad(HEADER, 0)))
    assert len(frame) == chunk.nbytes + OVERHEAD
    assert chunk.tobytes() not in frame
    opened = server.open(memoryview(frame), bulk.chunk_aad(HEADER, 0))
    np.testing.assert_array_equal(np.frombuffer(opened.buffer, dtype=np.float32), chunk)
    back = bytes(server.seal_new(memoryview(chunk).cast("B"), bulk.chunk_aad(HEADER, 0)))
    assert back != frame  # the other direction's key
    assert len(client.open(memoryview(back), bulk.chunk_aad(HEADER, 0), client.inbox)) == 4000


@pytest.mark.parametrize("aad", [bulk.chunk_aad(HEADER, 1), bulk.chunk_aad(b"x" * 32, 0)])
def test_a_chunk_moved_to_another_place_or_message_is_refused_and_zeroed(aad: bytes) -> None:
    client, server = _pair()
    frame = bytes(client.seal_new(memoryview(b"\x07" * 64), bulk.chunk_aad(HEADER, 0)))
    out = memoryview(bytearray(64))
    with pytest.raises(BulkFrameRefused, match="bad tag"):
        server.open(memoryview(frame), aad, out)
    assert bytes(out) == bytes(64)
    assert server.refused == 1
    with pytest.raises(BulkFrameRefused, match="closed by an earlier refusal"):
        server.open(memoryview(frame), bulk.chunk_aad(HEADER, 0))  # not even the right one


def test_a_new_session_seals_the_same_chunk_at_the_same_counter_to_another_frame() -> None:
    first, _ = _pair()
    second, second_server = _pair()
    chunk = memoryview(b"\x01" * 256)
    a = bytes(first.seal_new(chunk, bulk.chunk_aad(HEADER, 0)))
    b = bytes(second.seal_new(chunk, bulk.chunk_aad(HEADER, 0)))
    assert a[:12] == b[:12]  # both the first frame of epoch 0: the keys tell them apart
    assert a[12:] != b[12:]
    with pytest.raises(BulkFrameRefused):
        second_server.open(memoryview(a), bulk.chunk_aad(HEADER, 0))


def test_a_server_sends_no_chunk_in_clear_for_a_peer_whose_keys_are_gone() -> None:
    channels = bulk.ServerChannels(CIPHER)
    channels.opened(b"peer", os.urandom(32))
    binding = HEADER[:32]
    assert len(channels.seal(b"peer", memoryview(b"\x02" * 10), binding, 0) or b"") == 10 + OVERHEAD
    channels.drop(b"peer")
    gone = channels.seal(b"peer", memoryview(b"\x02" * 10), binding, 1)
    assert gone is not None and gone.nbytes == 0
    assert bulk.ServerChannels(None).seal(b"peer", memoryview(b"\x02"), binding, 0) is None
    with pytest.raises(BulkFrameRefused, match="keys are gone"):
        channels.open(b"peer", memoryview(bytes(10 + OVERHEAD)), HEADER, 0)
