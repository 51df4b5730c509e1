"""AEAD bulk frames: what one end seals the other opens, once, in order, and nothing else."""

from __future__ import annotations

import random

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ember.errors import ProtocolError
from ember.wire.bulk_cipher import (
    CIPHERS,
    MAX_PAYLOAD,
    OVERHEAD,
    PREFIX,
    PREFIX_BYTES,
    TAG_BYTES,
    BulkFrameRefused,
    BulkOpener,
    BulkSealer,
    derive_bulk_keys,
    direction_key,
    next_key,
    preferred_cipher,
)
from ember.wire.frames import CHUNK_BYTES, mac

SECRET = b"s" * 32
AES, CHACHA = "aes-256-gcm", "chacha20-poly1305"
HEADER_MAC = mac(SECRET, b"header")


def session(server_nonce: bytes = b"n" * 32, client_nonce: bytes = b"c" * 32) -> bytes:
    return mac(SECRET, b"session", server_nonce + client_nonce)  # as handshake.py derives it


def pair(
    cipher: str = AES, key: bytes | None = None, **limits: int
) -> tuple[BulkSealer, BulkOpener]:
    """The client's sealer and the server's opener of one connection: client -> server."""
    key = session() if key is None else key
    sealer, _ = derive_bulk_keys(key, "client", cipher, **limits)
    _, opener = derive_bulk_keys(key, "server", cipher, **limits)
    return sealer, opener


def aad(index: int) -> bytes:
    return HEADER_MAC + index.to_bytes(4, "big")


def refused(opener: BulkOpener, frame: bytes, reason: str, index: int = 0) -> None:
    """`frame` is refused for `reason`, and the opener stays closed after it."""
    before = opener.refused
    with pytest.raises(BulkFrameRefused, match=reason):
        opener.open_into(frame, bytearray(max(len(frame), 1)), aad(index))
    assert opener.refused == before + 1
    with pytest.raises(BulkFrameRefused, match="closed by an earlier refusal"):
        opener.open_into(b"", bytearray(1), b"")
    assert opener.refused == before + 2


@pytest.mark.parametrize("cipher", [AES, CHACHA])
def test_frames_round_trip_in_both_directions(cipher: str) -> None:
    client_sealer, client_opener = derive_bulk_keys(session(), "client", cipher)
    server_sealer, server_opener = derive_bulk_keys(session(), "server", cipher)
    for index, payload in enumerate([b"", b"x", bytes(range(256)) * 100]):
        frame = client_sealer.seal(payload, aad(index))
        assert len(frame) == len(payload) + OVERHEAD == len(payload) + 28
        assert PREFIX.unpack_from(frame) == (0, index)
        out = bytearray(len(payload))
        assert server_opener.open_into(frame, out, aad(index)) == len(payload)
        assert out == payload
        reply = server_sealer.seal(payload[::-1], aad(index))
        back = bytearray(len(payload))
        assert client_opener.open_into(reply, back, aad(index)) == len(payload)
        assert back == payload[::-1]
    assert server_opener.refused == client_opener.refused == 0


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 3 * CHUNK_BYTES + 7), st.binary(max_size=64), st.integers(0, 2**32))
@example(0, b"", 0)
@example(CHUNK_BYTES, b"x", 1)
@example(3 * CHUNK_BYTES + 7, b"\0" * 64, 2)
def test_messages_of_any_size_round_trip_in_chunk_frames(
    size: int, extra: bytes, seed: int
) -> None:
    message = random.Random(seed).randbytes(size)
    sealer, opener = pair()
    chunks = [message[s : s + CHUNK_BYTES] for s in range(0, size, CHUNK_BYTES)] or [b""]
    received = bytearray()
    for index, chunk in enumerate(chunks):
        frame = bytearray(len(chunk) + OVERHEAD)
        assert sealer.seal_into(chunk, frame, extra + aad(index)) == len(frame)
        out = bytearray(CHUNK_BYTES)
        received += out[: opener.open_into(frame, out, extra + aad(index))]
    assert received == message


def test_sealing_or_opening_in_place_is_refused_before_a_nonce_is_spent() -> None:
    # cryptography 51 refuses overlapping buffers (48 took them): refused here whichever
    sealer, opener = pair()
    payload = bytes(range(200))
    buffer = bytearray(PREFIX_BYTES) + bytearray(payload) + bytearray(TAG_BYTES)
    view = memoryview(buffer)
    with pytest.raises(ValueError, match="plaintext and out must not overlap"):
        sealer.seal_into(view[PREFIX_BYTES:-TAG_BYTES], view, aad(0))
    assert bytes(view[PREFIX_BYTES:-TAG_BYTES]) == payload  # untouched
    frame = bytearray(sealer.seal(payload, aad(0)))  # counter 0: the refusal spent nothing
    with pytest.raises(ValueError, match="frame and out must not overlap"):
        opener.open_into(frame, memoryview(frame)[PREFIX_BYTES:-TAG_BYTES], aad(0))
    out = bytearray(len(payload))
    assert opener.open_into(frame, out, aad(0)) == len(payload) and out == payload


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_a_flipped_bit_anywhere_is_refused_and_closes_the_opener(data: st.DataObject) -> None:
    sealer, opener = pair()
    frame = bytearray(sealer.seal(b"payload " * 8, aad(0)))
    bit = data.draw(st.integers(0, len(frame) * 8 - 1))
    frame[bit // 8] ^= 1 << (bit % 8)
    out = bytearray(len(frame))
    reason = "bad tag" if bit >= 8 * PREFIX_BYTES else "wrong epoch|wrong counter"
    with pytest.raises(BulkFrameRefused, match=reason):
        opener.open_into(frame, out, aad(0))
    assert out == bytes(len(out))  # the unauthenticated plaintext was zeroed
    good = sealer.seal(b"next", aad(1))
    with pytest.raises(BulkFrameRefused, match="closed by an earlier refusal"):
        opener.open_into(good, bytearray(4), aad(1))
    assert opener.refused == 2


def test_a_replayed_frame_is_refused() -> None:
    sealer, opener = pair()
    frame = sealer.seal(b"once", aad(0))
    assert opener.open_into(frame, bytearray(4), aad(0)) == 4
    refused(opener, frame, r"wrong counter: 0, expected 1")


def test_reordered_and_dropped_frames_are_refused() -> None:
    sealer, opener = pair()
    sealer.seal(b"a", aad(0))
    refused(opener, sealer.seal(b"b", aad(1)), r"wrong counter: 1, expected 0", index=1)
    sealer, opener = pair()
    assert opener.open_into(sealer.seal(b"a", aad(0)), bytearray(1), aad(0)) == 1
    sealer.seal(b"b", aad(1))  # lost on the way
    refused(opener, sealer.seal(b"c", aad(2)), r"wrong counter: 2, expected 1", index=2)


def test_a_frame_of_another_connection_is_refused() -> None:
    sealer, _ = pair(key=session(client_nonce=b"d" * 32))
    _, opener = pair(key=session())
    refused(opener, sealer.seal(b"theirs", aad(0)), "bad tag on frame 0 of epoch 0")


def test_a_frame_for_the_other_direction_is_refused() -> None:
    server_sealer, server_opener = derive_bulk_keys(session(), "server", AES)
    refused(server_opener, server_sealer.seal(b"echo", aad(0)), "bad tag")
    client_sealer, _ = derive_bulk_keys(session(), "client", AES)
    _, client_opener = derive_bulk_keys(session(), "client", AES)
    refused(client_opener, client_sealer.seal(b"echo", aad(0)), "bad tag")


def test_a_frame_sealed_with_the_other_cipher_is_refused() -> None:
    sealer, _ = pair(CHACHA)
    _, opener = pair(AES)
    refused(opener, sealer.seal(b"mixed", aad(0)), "bad tag")


def test_truncated_frames_are_refused() -> None:
    sealer, opener = pair()
    frame = sealer.seal(b"sixteen bytes...", aad(0))
    refused(opener, frame[:-1], "bad tag")
    _, opener = pair()
    refused(opener, frame[: OVERHEAD - 1], r"truncated: 27 bytes, less than the 28")
    _, opener = pair()
    refused(opener, b"", r"truncated: 0 bytes")


def test_oversized_frames_are_refused_before_any_crypto() -> None:
    _, opener = pair()
    refused(opener, bytes(MAX_PAYLOAD + OVERHEAD + 1), "oversized: a 1048577-byte payload")
    sealer, _ = pair()
    with pytest.raises(ValueError, match="at most 1048576 bytes"):
        sealer.seal(bytes(MAX_PAYLOAD + 1))
    assert PREFIX.unpack_from(sealer.seal(b"x")) == (0, 0)  # the refused call spent no nonce


def test_wrong_associated_data_is_refused() -> None:
    sealer, opener = pair()
    refused(opener, sealer.seal(b"chunk", aad(0)), "bad tag", index=1)  # another chunk index
    sealer, opener = pair()
    frame = sealer.seal(b"chunk", aad(0))
    with pytest.raises(BulkFrameRefused, match="bad tag"):
        opener.open_into(frame, bytearray(5), mac(SECRET, b"other header") + aad(0)[32:])


def test_a_frame_with_a_forged_epoch_is_refused() -> None:
    sealer, opener = pair()
    frame = bytearray(sealer.seal(b"x", aad(0)))
    PREFIX.pack_into(frame, 0, 1, 0)
    refused(opener, bytes(frame), r"wrong epoch: 1, expected 0")


def reference_keys(cipher: str, epochs: int) -> list[bytes]:
    """The client -> server key of each epoch, straight from the documented key schedule."""
    keys = [direction_key(session(), cipher, "client")]
    for epoch in range(1, epochs):
        keys.append(next_key(keys[-1], epoch))
    return keys


@pytest.mark.parametrize("cipher", [AES, CHACHA])
def test_keys_ratchet_every_few_frames_and_no_key_and_nonce_pair_repeats(cipher: str) -> None:
    sealer, opener = pair(cipher, frame_limit=3)
    keys = reference_keys(cipher, 5)
    seen = set()
    for index in range(14):
        payload = f"frame {index}".encode()
        frame = sealer.seal(payload, aad(index))
        epoch, counter = PREFIX.unpack_from(frame)
        assert (epoch, counter) == (index // 3, index % 3)
        nonce = frame[:PREFIX_BYTES]
        aead = CIPHERS[cipher](keys[epoch])  # the frame opens under that epoch's key alone
        assert aead.decrypt(nonce, frame[PREFIX_BYTES:], nonce + aad(index)) == payload
        seen.add((keys[epoch], nonce))
        out = bytearray(len(payload))
        assert opener.open_into(frame, out, aad(index)) == len(payload) and out == payload
    assert len(seen) == 14 and len(set(keys)) == 5
    assert (sealer.epoch, opener.epoch) == (4, 4)


def test_keys_ratchet_when_the_byte_budget_runs_out() -> None:
    sealer, opener = pair(byte_limit=100)
    sizes = [60, 40, 1, 99, 0, 100, 100, 30, 80]
    # 60+40 fill epoch 0; 1+99 epoch 1; the empty frame still fits; 100; 100; 30 (+80 > 100)
    expected = [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2), (2, 0), (3, 0), (4, 0), (5, 0)]
    keys = reference_keys(AES, 6)
    seen = set()
    for index, (size, where) in enumerate(zip(sizes, expected, strict=True)):
        payload = bytes([index]) * size
        frame = sealer.seal(payload, aad(index))
        assert PREFIX.unpack_from(frame) == where
        nonce = frame[:PREFIX_BYTES]
        aead = AESGCM(keys[where[0]])
        assert aead.decrypt(nonce, frame[PREFIX_BYTES:], nonce + aad(index)) == payload
        seen.add((keys[where[0]], nonce))
        out = bytearray(size)
        assert opener.open_into(frame, out, aad(index)) == size and out == payload
    assert len(seen) == len(sizes)
    with pytest.raises(ValueError, match="at most 100 bytes"):
        sealer.seal(bytes(101))


def test_an_exhausted_key_chain_refuses_to_seal_or_open() -> None:
    sealer, opener = pair(frame_limit=1)
    sealer.epoch = opener.epoch = 2**32 - 1
    frame = sealer.seal(b"last", aad(0))
    assert opener.open_into(frame, bytearray(4), aad(0)) == 4
    with pytest.raises(ProtocolError, match="bulk keys exhausted"):
        sealer.seal(b"one more")
    refused(opener, frame, "bulk keys exhausted")


def test_connections_from_one_secret_share_no_key() -> None:
    sessions = [session(b"n" * 32, b"c" * 32), session(b"n" * 32, b"d" * 32), session()]
    assert sessions[0] == sessions[2] and sessions[0] != sessions[1]
    keys = {
        direction_key(key, cipher, role)
        for key in sessions[:2]
        for cipher in CIPHERS
        for role in ("client", "server")
    }
    assert len(keys) == 8
    assert all(len(key) == 32 and key not in sessions for key in keys)


def test_derivation_checks_its_arguments() -> None:
    with pytest.raises(ProtocolError, match="unknown bulk cipher 'rot13'"):
        derive_bulk_keys(session(), "client", "rot13")
    with pytest.raises(ValueError, match="role must be one of"):
        derive_bulk_keys(session(), "worker", AES)
    with pytest.raises(ValueError, match="session key must be 32 bytes"):
        derive_bulk_keys(b"short", "client", AES)
    with pytest.raises(ValueError, match="frame_limit"):
        derive_bulk_keys(session(), "client", AES, frame_limit=0)


def test_the_cipher_follows_the_cpus_aes_instructions(tmp_path) -> None:
    x86, arm, plain = tmp_path / "x86", tmp_path / "arm", tmp_path / "plain"
    x86.write_text("processor\t: 0\nflags\t\t: fpu sse2 aes avx2\n")
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1\n")
    plain.write_text("processor\t: 0\nflags\t\t: fpu sse2 vaes_like avx2\nmodel name\t: aes\n")
    assert preferred_cipher(str(x86)) == preferred_cipher(str(arm)) == AES
    assert preferred_cipher(str(plain)) == CHACHA
    assert preferred_cipher(str(tmp_path / "missing")) in CIPHERS
    assert isinstance(CIPHERS[CHACHA](bytes(32)), ChaCha20Poly1305)
