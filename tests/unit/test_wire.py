"""Header frames are checked before they are parsed; payload frames against the header."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.algorithms.rules import SGDRule
from ember.errors import ProtocolError
from ember.wire import CHUNK_BYTES, ClientConnection, gather, seal, tensors_from_frames, unseal
from ember.wire.frames import chunk_frames, describe, mac
from tests.conftest import SECRET, running_servers

KEY = b"k" * 32


def test_sealed_header_round_trips() -> None:
    header = {"op": "push", "worker": 3, "seq": 7, "keys": [0, 10]}
    assert unseal(KEY, seal(KEY, header)) == header


def test_header_sealed_with_another_key_is_rejected() -> None:
    with pytest.raises(ProtocolError, match="HMAC does not match"):
        unseal(KEY, seal(b"x" * 32, {"op": "push"}))


def test_flipped_byte_in_the_body_is_rejected_before_parsing() -> None:
    frame = bytearray(seal(KEY, {"op": "push", "seq": 1}))
    frame[-1] ^= 1
    with pytest.raises(ProtocolError, match="HMAC does not match"):
        unseal(KEY, bytes(frame))


def test_truncated_and_oversized_header_frames_are_rejected() -> None:
    with pytest.raises(ProtocolError, match="outside the allowed size"):
        unseal(KEY, b"short")
    with pytest.raises(ProtocolError, match="outside the allowed size"):
        unseal(KEY, b"x" * (32 + 64 * 1024 + 1))


def test_authentic_header_that_is_not_a_map_with_an_op_is_rejected() -> None:
    body = msgpack.packb([1, 2, 3])
    with pytest.raises(ProtocolError, match="map with a string 'op'"):
        unseal(KEY, mac(KEY, body) + body)


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_random_bytes_only_ever_raise_protocol_error(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        unseal(KEY, data)


def test_large_tensor_travels_in_chunks_and_is_reassembled_exactly() -> None:
    array = np.arange(CHUNK_BYTES // 4 * 2 + 5, dtype=np.float32)
    frames = [bytes(f) for f in chunk_frames([array])]
    assert [len(f) for f in frames] == [CHUNK_BYTES, CHUNK_BYTES, 20]
    chunks = tensors_from_frames(describe([array]), frames, max_bytes=array.nbytes)
    out = gather(chunks[0], np.empty_like(array))
    np.testing.assert_array_equal(out, array)


def test_payload_frame_of_the_wrong_length_is_rejected() -> None:
    array = np.ones(10, dtype=np.float32)
    with pytest.raises(ProtocolError, match="payload frame 0 has 36 bytes, header declares 40"):
        tensors_from_frames(describe([array]), [b"x" * 36], max_bytes=1000)


def test_missing_and_extra_payload_frames_are_rejected() -> None:
    table = describe([np.ones(4, dtype=np.float32)])
    with pytest.raises(ProtocolError, match="declares more"):
        tensors_from_frames(table, [], max_bytes=1000)
    with pytest.raises(ProtocolError, match="payload has 2 frames, header declares 1"):
        tensors_from_frames(table, [b"x" * 16, b"y"], max_bytes=1000)


def test_declared_size_beyond_the_limit_is_rejected_before_reading_frames() -> None:
    with pytest.raises(ProtocolError, match="exceeds the 4000-byte limit"):
        tensors_from_frames([["float32", [1_000_000]]], [], max_bytes=4000)


def test_unknown_dtype_and_malformed_shapes_are_rejected() -> None:
    for table in ([["complex64", [3]]], [["float32", [-1]]], [["float32", "3"]], "nope"):
        with pytest.raises(ProtocolError):
            tensors_from_frames(table, [], max_bytes=1000)


def test_declared_sizes_that_would_overflow_64_bits_are_rejected() -> None:
    table = [["float32", [2**39, 2**24 + 2**23]], ["float32", [2**39, 2**23]]]
    with pytest.raises(ProtocolError, match="exceeds the 4000-byte limit"):
        tensors_from_frames(table, [], max_bytes=4000)


def test_closing_a_watched_client_connection_twice_does_not_raise() -> None:
    with running_servers(np.zeros(4, dtype=np.float32), SGDRule(lr=1.0)) as (server,):
        connection = ClientConnection(server.address, SECRET, timeout=5, watch=True)
        connection.close()
        connection.close()
        assert connection._sock.closed
