"""AEAD bulk frames on live connections (--encrypt on with the "aead" wire cipher): exchanges
come back exact, and a payload frame that was tampered with, replayed, reordered, sealed for
another connection or cut short is refused before use, counted, and ends its peer's
connection, with nothing applied to the parameters. No (key, nonce) pair is sealed twice,
across connections and across the keys' ratchets."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from ember.algorithms.rules import SGDRule
from ember.errors import ProtocolError
from ember.ps import PSClient
from ember.ps.server import ParameterServer
from ember.wire import CHUNK_BYTES, CONNECTION_ERRORS, ClientConnection, bulk, curve, shared
from ember.wire.bulk_cipher import BulkSealer
from ember.wire.frames import seal
from tests.conftest import SECRET, running_servers, transport

pytestmark = pytest.mark.timeout(120)

FLOATS = 2 * CHUNK_BYTES // 4  # a push of two full chunks
Forge = Callable[[ClientConnection, bytes, ClientConnection], list[bytes]]


@pytest.fixture(autouse=True)
def aead_wire() -> Iterator[None]:
    """This process's connections encrypted with AEAD bulk frames, as a run would set them."""
    before = curve.wire_cipher()
    curve.use_wire_cipher("aead")
    try:
        with transport(True):
            yield
    finally:
        curve.use_wire_cipher(before)


def _chunk(index: int) -> memoryview:
    values = np.full(FLOATS, 1.0 + index, dtype=np.float32)
    return memoryview(values.view(np.uint8))[index * CHUNK_BYTES : (index + 1) * CHUNK_BYTES]


def _sealed(connection: ClientConnection, header_frame: bytes, index: int) -> bytes:
    assert connection._bulk is not None
    return bytes(connection._bulk.seal_new(_chunk(index), bulk.chunk_aad(header_frame, index)))


def _flipped(conn: ClientConnection, header: bytes, other: ClientConnection) -> list[bytes]:
    first = bytearray(_sealed(conn, header, 0))
    first[1000] ^= 0x01
    return [bytes(first), _sealed(conn, header, 1)]


def _replayed(conn: ClientConnection, header: bytes, other: ClientConnection) -> list[bytes]:
    first = _sealed(conn, header, 0)
    return [first, first]


def _reordered(conn: ClientConnection, header: bytes, other: ClientConnection) -> list[bytes]:
    first, second = _sealed(conn, header, 0), _sealed(conn, header, 1)
    return [second, first]


def _other_key(conn: ClientConnection, header: bytes, other: ClientConnection) -> list[bytes]:
    return [_sealed(other, header, 0), _sealed(other, header, 1)]


def _truncated(conn: ClientConnection, header: bytes, other: ClientConnection) -> list[bytes]:
    return [_sealed(conn, header, 0)[:-1]]


def _stats(server: ParameterServer) -> tuple[int, int]:
    """(bulk frames refused, connections cut for them) at the server."""
    endpoint = server.endpoint
    return endpoint.rejected["bulk_frame"], endpoint.peer_state["shed_forged"]


@pytest.mark.parametrize("policy", ["bsp", "async"])
@pytest.mark.parametrize("forge", [_flipped, _replayed, _reordered, _other_key, _truncated])
def test_a_forged_payload_frame_is_refused_counted_ends_the_peer_and_applies_nothing(
    forge: Forge, policy: str
) -> None:
    """Nothing of the refused frame or after it is applied. Under async a push may be
    folded chunk by chunk as it arrives, so a frame refused after authentic ones (the replay
    of chunk 0 as chunk 1) may leave those folded, as a connection that breaks mid-push does."""
    params = np.zeros(FLOATS, dtype=np.float32)
    with running_servers(params, SGDRule(lr=1.0), policy, expected_workers=1) as (server,):
        client = PSClient([server.address], SECRET, worker=0, timeout=5)
        other = ClientConnection(server.address, SECRET, timeout=5)
        try:
            client.register()
            connection = client.connections[0]
            assert connection.bulk_cipher is not None and connection._bulk is not None
            header = {
                "op": "push",
                "worker": 0,
                "incarnation": 0,
                "seq": 5,
                "clock": 0,
                "step": 1,
                "keys": [0, FLOATS],
                "tensors": [["float32", [FLOATS]]],
            }
            sessions = server.endpoint.peer_state["sessions"]
            sealed = seal(connection._key, header)
            connection._sock.send(sealed)
            for frame in forge(connection, sealed, other):
                connection._sock.send(frame)
            with pytest.raises(CONNECTION_ERRORS, match="closed the connection"):
                connection.recv()
            assert _stats(server) == (1, 1)
            assert server.endpoint.peer_state["sessions"] == sessions - 1  # its session went
            out = np.full(FLOATS, np.nan, dtype=np.float32)
            fresh = PSClient([server.address], SECRET, worker=0, timeout=5)
            fresh.register()
            fresh.pull(out)
            fresh.close()
        finally:
            other.close()
            client.close()
    expected = np.zeros(FLOATS, dtype=np.float32)
    if policy == "async" and forge is _replayed and out[0] != 0:
        expected[: CHUNK_BYTES // 4] = -1.0  # chunk 0 (authentic, times lr 1), folded whole
    np.testing.assert_array_equal(out, expected)  # nothing of the forged frame was applied


def test_exchanges_over_aead_frames_are_exact_and_seal_no_key_and_nonce_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Keys ratchet every 3 frames here; two clients, each reconnecting once, push and pull
    multi-chunk payloads, and every (key, nonce) either end sealed under is new."""
    monkeypatch.setattr(bulk, "FRAME_LIMIT", 3)
    monkeypatch.setenv(shared.DISABLE_VARIABLE, "0")  # every payload on the socket
    used: list[tuple[bytes, bytes]] = []
    seal_into = BulkSealer.seal_into

    def recording(self: BulkSealer, plaintext, out, aad=b""):  # type: ignore[no-untyped-def]
        size = seal_into(self, plaintext, out, aad)
        used.append((self._key, bytes(memoryview(out)[:12])))
        return size

    monkeypatch.setattr(BulkSealer, "seal_into", recording)
    floats = 3 * CHUNK_BYTES // 4 + 7  # four chunks a message
    params = np.zeros(floats, dtype=np.float32)
    grad = np.linspace(-1, 1, floats, dtype=np.float32)
    with running_servers(params, SGDRule(lr=1.0)) as (server,):
        for attempt in range(2):  # a reconnect: a new session, new keys
            for worker in (2 * attempt, 2 * attempt + 1):
                client = PSClient([server.address], SECRET, worker=worker, timeout=10)
                assert client.connections[0].bulk_cipher is not None
                client.register()
                for _ in range(3):
                    client.push(grad)
                out = np.empty(floats, dtype=np.float32)
                client.pull(out)
                client.close()
        assert server.endpoint.rejected["bulk_frame"] == 0
    np.testing.assert_allclose(out, -12 * grad, rtol=1e-5, atol=1e-5)
    epochs = {int.from_bytes(nonce[:4], "big") for _key, nonce in used}
    assert len(epochs) > 3  # the keys did ratchet, on both ends
    assert len(used) > 40
    assert len(set(used)) == len(used)
    assert len({key for key, _nonce in used}) > 8


def test_a_forged_reply_frame_is_refused_ends_the_connection_and_never_lands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The client's side: a reply frame whose tag fails leaves the caller's array as it was."""
    sealer = bulk.ServerChannels.seal

    def flipping(
        self: bulk.ServerChannels, peer: bytes, chunk: memoryview, binding: bytes, index: int
    ) -> memoryview | None:
        frame = sealer(self, peer, chunk, binding, index)
        if frame:
            frame[-1] ^= 0x80
        return frame

    monkeypatch.setattr(bulk.ServerChannels, "seal", flipping)
    monkeypatch.setenv(shared.DISABLE_VARIABLE, "0")
    params = np.ones(1000, dtype=np.float32)
    with running_servers(params, SGDRule(lr=1.0)) as (server,):
        client = PSClient([server.address], SECRET, worker=0, timeout=5)
        try:
            client.register()
            connection = client.connections[0]
            out = np.full(1000, 7.0, dtype=np.float32)
            with pytest.raises(CONNECTION_ERRORS, match="bulk frame refused: bad tag"):
                client.pull(out)
            assert connection.refused_frames == 1
            with pytest.raises(CONNECTION_ERRORS):  # closed: it sends nothing more
                connection.send({"op": "pull", "worker": 0, "seq": 2})
        finally:
            client.close()
    np.testing.assert_array_equal(out, 7.0)


def test_a_push_refused_at_its_header_keeps_the_connection_in_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The chunks of a refused push still come, sealed under their counters: the server opens
    and drops them, so the connection's next payload opens and nothing is cut."""
    monkeypatch.setenv(shared.DISABLE_VARIABLE, "0")
    params = np.zeros(FLOATS, dtype=np.float32)
    with running_servers(params, SGDRule(lr=1.0)) as (server,):
        client = PSClient([server.address], SECRET, worker=0, timeout=5)
        try:
            client.register()
            for bad in (np.ones(FLOATS - 1, np.float32), np.ones(FLOATS, np.float64)):
                with pytest.raises(ProtocolError, match="must carry one float32 tensor"):
                    client.push(bad)
            client.push(np.ones(FLOATS, dtype=np.float32))
            out = np.empty(FLOATS, dtype=np.float32)
            client.pull(out)
            connection = client.connections[0]
        finally:
            client.close()
        assert _stats(server) == (0, 0)
    assert connection.refused_frames == 0
    np.testing.assert_array_equal(out, -1.0)


def _captured_on_loopback(exchange: Callable[[], None]) -> bytes:
    """Every packet on the loopback interface while `exchange` runs (needs CAP_NET_RAW)."""
    try:
        sniffer = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(0x0003))
    except (PermissionError, AttributeError, OSError) as exc:
        pytest.skip(f"no packet capture here: {exc}")
    sniffer.bind(("lo", 0))
    sniffer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
    sniffer.settimeout(0.2)
    packets: list[bytes] = []
    stop = threading.Event()

    def capture() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                packets.append(sniffer.recv(1 << 17))

    thread = threading.Thread(target=capture, daemon=True)
    thread.start()
    try:
        exchange()
    finally:
        time.sleep(0.3)
        stop.set()
        thread.join(5)
        sniffer.close()
    return b"".join(packets)


@pytest.mark.parametrize("encrypt", [True, False])
def test_no_parameter_byte_crosses_the_wire_in_clear_with_aead_frames(
    encrypt: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parameters and gradients of one recognisable pattern go both ways over TCP; with
    encryption off the capture shows the pattern, so the check is one that can fail."""
    monkeypatch.setenv(shared.DISABLE_VARIABLE, "0")
    marker = np.frombuffer(b"EMBER-PARAMETERS", dtype=np.float32)  # 4 floats, 16 bytes
    params = np.tile(marker, 50_000)
    with transport(encrypt), running_servers(params.copy(), SGDRule(lr=0.0)) as (server,):

        def exchange() -> None:
            client = PSClient([server.address], SECRET, worker=0, timeout=10)
            client.register()
            out = np.empty_like(params)
            client.push(params)
            client.pull(out)
            client.close()
            np.testing.assert_array_equal(out, params)

        seen = _captured_on_loopback(exchange)
    assert len(seen) > 2 * params.nbytes  # the exchange was captured
    assert (b"EMBER-PARAMETERS" * 2 in seen) is not encrypt


@pytest.mark.parametrize("strategy", ["easgd-async", "bsp"])
def test_a_run_with_the_aead_wire_cipher_trains_with_its_payloads_sealed(
    tmp_path: Path, strategy: str
) -> None:
    out = tmp_path / "run"
    flags = ["--data", "digits", "--strategy", strategy, "--epochs", "2", "--wire-cipher", "aead"]
    done = subprocess.run(
        [sys.executable, "-m", "ember", "train", *flags, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "EMBER_SHARED_MEMORY": "0"},  # every payload on the socket
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    wire = {key: summary["wire"][key] for key in ("encrypted", "cipher", "shared_memory_payloads")}
    assert wire == {"encrypted": True, "cipher": "aead", "shared_memory_payloads": 0}
    assert summary["wire"]["lanes"] in (1, 2, 4)  # what each worker's probe chose
    assert summary["server"]["rejected"].get("bulk_frame", 0) == 0
    assert summary["test_accuracy"] > 0.85
