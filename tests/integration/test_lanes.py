"""Lanes on live connections (wire/lanes.py): a connection's payloads striped over several
sockets come back exact under every transport; a lane's frame that was tampered with,
replayed, reordered, sealed under another key or cut short is refused before use and ends
the connection with every lane, with nothing applied; a lane may join only with its
connection's token, may not run far ahead, and one that dies mid-request breaks that request
alone. A probe times real payloads the server discards, and a run reports its lanes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from ember.algorithms.rules import SGDRule
from ember.errors import ProtocolError, ServerGone
from ember.ps import PSClient
from ember.ps.server import ParameterServer
from ember.wire import (
    CHUNK_BYTES,
    CONNECTION_ERRORS,
    ClientConnection,
    bulk,
    curve,
    lanes,
    probe,
    shared,
    use_wire_lanes,
)
from ember.wire.frames import seal
from tests.conftest import SECRET, running_servers, transport

pytestmark = pytest.mark.timeout(120)

FLOATS = 4 * CHUNK_BYTES // 4  # four chunks: lane 0 carries 0 and 2, lane 1 carries 1 and 3
Forge = Callable[[ClientConnection, ClientConnection, bytes], list[bytes]]


@pytest.fixture(autouse=True)
def on_the_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(shared.DISABLE_VARIABLE, "0")  # lanes stripe what the socket carries


@pytest.fixture
def aead_wire() -> Iterator[None]:
    before = curve.wire_cipher()
    curve.use_wire_cipher("aead")
    try:
        with transport(True):
            yield
    finally:
        curve.use_wire_cipher(before)


@pytest.mark.parametrize("count", [2, 3])
@pytest.mark.parametrize("wire", ["plain", "curve", "aead"])
def test_exchanges_striped_over_lanes_are_exact(wire: str, count: int) -> None:
    floats = 5 * CHUNK_BYTES // 4 + 7  # six chunks, the last short
    grad = np.linspace(-1, 1, floats, dtype=np.float32)
    before = curve.wire_cipher()
    curve.use_wire_cipher("aead" if wire == "aead" else "curve")
    use_wire_lanes(str(count))
    try:
        with (
            transport(wire != "plain"),
            running_servers(np.zeros(floats, np.float32), SGDRule(lr=1.0)) as (server,),
        ):
            client = PSClient([server.address], SECRET, worker=0, timeout=10)
            client.register()
            assert client.connections[0].lane_count == count
            for _ in range(3):
                client.push(grad)
            out = np.empty(floats, dtype=np.float32)
            client.pull(out)
            client.close()
            usage = server.endpoint.lanes.usage()
            assert server.endpoint.rejected["bulk_frame"] == 0
    finally:
        curve.use_wire_cipher(before)
    np.testing.assert_allclose(out, -3 * grad, rtol=1e-6, atol=1e-6)
    assert usage == {"striped_requests": 4, "most_lanes": count}  # 3 pushes and the pull


def _sealed(lane: ClientConnection, header: bytes, index: int) -> bytes:
    chunk = memoryview(np.full(CHUNK_BYTES // 4, 1.0 + index, np.float32).view(np.uint8))
    assert lane._bulk is not None
    return bytes(lane._bulk.seal_new(chunk, bulk.chunk_aad(header, index)))


def _flipped(conn: ClientConnection, lane: ClientConnection, header: bytes) -> list[bytes]:
    first = bytearray(_sealed(lane, header, 1))
    first[1000] ^= 0x01
    return [bytes(first), _sealed(lane, header, 3)]


def _replayed(conn: ClientConnection, lane: ClientConnection, header: bytes) -> list[bytes]:
    first = _sealed(lane, header, 1)
    return [first, first]


def _reordered(conn: ClientConnection, lane: ClientConnection, header: bytes) -> list[bytes]:
    first, second = _sealed(lane, header, 1), _sealed(lane, header, 3)
    return [second, first]


def _other_key(conn: ClientConnection, lane: ClientConnection, header: bytes) -> list[bytes]:
    return [_sealed(conn, header, 1), _sealed(conn, header, 3)]  # the connection's own keys


def _truncated(conn: ClientConnection, lane: ClientConnection, header: bytes) -> list[bytes]:
    return [_sealed(lane, header, 1)[:-1]]


# A striped push of all keys, as worker 0's first after registering, named by its header.
PUSH = {"op": "push", "worker": 0, "incarnation": 0, "seq": 5, "step": 1, "keys": [0, FLOATS]}
PUSH |= {"tensors": [["float32", [FLOATS]]], "lanes": 2}


@contextmanager
def _striped_worker() -> Iterator[tuple[ParameterServer, ClientConnection]]:
    """A bsp server of zeros, and worker 0's registered connection to it on 2 lanes; on
    leaving, what a fresh worker pulls must still be zeros: nothing was applied."""
    use_wire_lanes("2")
    params = np.zeros(FLOATS, dtype=np.float32)
    with running_servers(params, SGDRule(lr=1.0), "bsp", expected_workers=1) as (server,):
        client = PSClient([server.address], SECRET, worker=0, timeout=5)
        try:
            client.register()
            yield server, client.connections[0]
            fresh = PSClient([server.address], SECRET, worker=0, timeout=5)
            fresh.register()
            out = np.full(FLOATS, np.nan, dtype=np.float32)
            fresh.pull(out)
            fresh.close()
        finally:
            client.close()
    np.testing.assert_array_equal(out, 0.0)


def _wait_for(done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not done():
        assert time.monotonic() < deadline
        time.sleep(0.02)


@pytest.mark.parametrize("early", [False, True], ids=["after", "ahead of its header"])
@pytest.mark.parametrize("forge", [_flipped, _replayed, _reordered, _other_key, _truncated])
@pytest.mark.usefixtures("aead_wire")
def test_a_forged_frame_on_a_lane_ends_the_connection_and_its_lanes_applying_nothing(
    forge: Forge, early: bool
) -> None:
    with _striped_worker() as (server, connection):
        lane = connection._lanes[0][0]
        sealed = seal(connection._key, PUSH)
        forged = forge(connection, lane, sealed)
        if early:  # the lane's frames wait, unopened, for the header that names them
            for frame in forged:
                lane._sock.send(frame)
            _wait_for(lambda: server.endpoint.peer_state["early_frames"] == len(forged))
        connection._sock.send(sealed)
        connection._sock.send(_sealed(connection, sealed, 0))
        connection._sock.send(_sealed(connection, sealed, 2))
        for frame in [] if early else forged:
            lane._sock.send(frame)
        with pytest.raises(CONNECTION_ERRORS, match="closed the connection"):
            connection.recv()
        state = server.endpoint.peer_state
        assert server.endpoint.rejected["bulk_frame"] == 1
        assert state["shed_forged"] == 1 and state["shed_lane"] >= 1


def test_a_lane_joins_only_with_its_connections_token() -> None:
    with running_servers(np.zeros(8, np.float32), SGDRule(lr=1.0)) as (server,):
        stranger = ClientConnection(server.address, SECRET, timeout=5)
        try:
            stranger.send({"op": "lane", "seq": 0, "token": "f" * 32, "index": 1})
            with pytest.raises(ProtocolError, match="unknown lane token"):
                stranger.recv()
            stranger.send({"op": "pull", "seq": 0, "lanes": 2})  # lanes it never opened
            with pytest.raises(ServerGone, match="lanes this connection has not opened"):
                stranger.recv()  # as for a lane lost: the caller connects anew
        finally:
            stranger.close()


def test_a_lane_that_runs_far_ahead_of_its_requests_is_cut(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lanes, "EARLY_BYTES", 3 * CHUNK_BYTES)
    with running_servers(np.zeros(8, np.float32), SGDRule(lr=1.0)) as (server,):
        connection = ClientConnection(server.address, SECRET, timeout=5, watch=True)
        try:
            connection.set_lanes(2)
            lane = connection._lanes[0][0]
            for _ in range(4):  # no header names them: they wait, up to the budget
                lane._sock.send(bytes(CHUNK_BYTES))
            _wait_for(lambda: server.endpoint.rejected["lane"] == 1)
            with pytest.raises(CONNECTION_ERRORS):  # the connection went with its lane
                connection.send({"op": "stats", "seq": 1})
                connection.recv()
        finally:
            connection.close()


def test_a_lane_that_dies_mid_request_breaks_it_and_nothing_is_applied() -> None:
    with _striped_worker() as (server, connection):
        connection._sock.send(seal(connection._key, PUSH))
        connection._sock.send(bytes(CHUNK_BYTES))  # chunk 0
        lane, context = connection._lanes.pop()
        lane._sock.send(bytes(CHUNK_BYTES))  # chunk 1; chunk 3 never comes
        _wait_for(lambda: server.endpoint.lanes.usage()["striped_requests"] == 1)  # mid-request
        lane.close()
        context.term()
        with pytest.raises(CONNECTION_ERRORS, match="closed the connection"):
            connection.recv()
        assert server.endpoint.peer_state["shed_lane"] >= 1


def test_a_lane_lost_between_requests_makes_the_worker_connect_anew() -> None:
    """The server forgets a lane that closed while idle; the worker's next request names it
    and is refused as one whose connection is gone, so the worker reconnects and sends it
    again, applied once."""
    use_wire_lanes("2")
    grad = np.ones(FLOATS, dtype=np.float32)
    with running_servers(np.zeros(FLOATS, np.float32), SGDRule(lr=1.0)) as (server,):
        client = PSClient([server.address], SECRET, worker=0, timeout=10)
        try:
            client.register()
            client.push(grad)
            connection = client.connections[0]
            lane, context = connection._lanes[0]
            lane.close()  # in its place, a connection the server never saw join
            stranger = ClientConnection(server.address, SECRET, 5, context, watch=True)
            connection._lanes[0] = (stranger, context)
            _wait_for(lambda: server.endpoint.lanes.stats()["lanes"] == 0)
            client.push(grad)
            out = np.empty(FLOATS, dtype=np.float32)
            client.pull(out)
            assert client.failovers == 1 and client.connections[0].lane_count == 2
        finally:
            client.close()
    np.testing.assert_array_equal(out, -2.0)


def test_a_probe_times_payloads_the_server_discards() -> None:
    with running_servers(np.ones(8, np.float32), SGDRule(lr=1.0)) as (server,):
        connection = ClientConnection(server.address, SECRET, timeout=10)
        try:
            choice = probe(connection, 4)
            assert sorted(choice.rates) == [1, 2, 4] and min(choice.rates.values()) > 0
            assert choice.lanes in (1, 2, 4) and connection.lane_count == choice.lanes
            assert server.endpoint.peer_state["streams"] == 0  # nothing of them kept
            client = PSClient([server.address], SECRET, worker=0, timeout=5)
            client.register()
            out = np.zeros(8, np.float32)
            client.pull(out)
            client.close()
        finally:
            connection.close()
    np.testing.assert_array_equal(out, 1.0)  # no probe reached the parameters


def test_a_run_reports_the_lanes_its_workers_striped_over(tmp_path: Path) -> None:
    out = tmp_path / "run"
    flags = ["--data", "digits", "--strategy", "easgd-async", "--epochs", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "ember", "train", *flags, "--wire-lanes", "2", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "EMBER_SHARED_MEMORY": "0"},
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["wire"]["lanes"] == 2 and summary["wire"]["striped_requests"] > 0
    assert summary["wire"]["shared_memory_payloads"] == 0
    assert summary["test_accuracy"] > 0.8


def test_a_connection_that_shares_memory_is_not_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(shared.DISABLE_VARIABLE, "1")
    with running_servers(np.ones(8, np.float32), SGDRule(lr=1.0)) as (server,):
        connection = ClientConnection(server.address, SECRET, timeout=10)
        try:
            assert connection.share_memory(32)  # the shard's 8 floats
            with pytest.raises(ValueError, match="shares memory"):
                probe(connection, 4)
            assert connection.lane_count == 1
        finally:
            connection.close()
