"""Bounds a server holds a credentialed client to: registrations past --max-workers are one
clear error, a push or pull whose step is negative or absurd is refused before it is applied,
a request that takes no payload cannot start one, and a connection speaks for its own worker."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from ember.algorithms.rules import SGDRule
from ember.config import RunConfig
from ember.engines.servers import ServerGroup
from ember.errors import ProtocolError
from ember.ps import PSClient, control, fetch_state
from ember.wire import CHUNK_BYTES, ClientConnection
from ember.wire.frames import seal
from tests.conftest import SECRET, running_servers

pytestmark = pytest.mark.timeout(120)


def test_a_server_started_with_max_workers_refuses_the_registration_past_it(
    tmp_path: Path,
) -> None:
    config = RunConfig(strategy="async", workers=2, max_workers=3).validate()
    group = ServerGroup(config, np.zeros(100, dtype=np.float32), SECRET, tmp_path)
    clients: list[PSClient] = []
    try:
        (address,) = group.start()
        for worker in (0, 1, 2):  # the run's two, and one joiner: the table is full
            clients.append(PSClient([address], SECRET, worker=worker, timeout=10))
            clients[-1].register()
        extra = PSClient([address], SECRET, worker=3, timeout=10)
        clients.append(extra)
        with pytest.raises(ProtocolError, match=r"worker 3 cannot register: .*max_workers=3"):
            extra.register()
        stats = control([address], SECRET, "stats")[0]
    finally:
        for client in clients:
            client.close()
        group.stop()
    assert stats["workers"]["max_workers"] == 3
    assert stats["workers"]["table"] == 3
    assert stats["rejected"] == {"register": 1, "request": 1}


@pytest.mark.parametrize("op", ["push", "pull"])
def test_a_negative_step_is_refused_counted_and_never_applied(op: str) -> None:
    params = np.zeros(100, dtype=np.float32)
    with running_servers(params, SGDRule(lr=1.0)) as (server,):
        client = PSClient([server.address], SECRET, worker=0, timeout=10)
        client.register()
        client.step = -1  # what the client sends as its resume point
        with pytest.raises(ProtocolError, match="'step' must be >= 0, got -1"):
            if op == "push":
                client.push(np.ones(100, dtype=np.float32))
            else:
                client.pull(np.empty(100, dtype=np.float32))
        client.step = 5
        client.push(np.ones(100, dtype=np.float32))  # the connection serves on
        state, meta = fetch_state([server.address], SECRET)
        stats = control([server.address], SECRET, "stats")[0]
        client.close()
    np.testing.assert_array_equal(state["params"], -np.ones(100, dtype=np.float32))  # one push
    assert meta["workers"]["0"]["step"] == 5
    assert stats["rejected"] == {"step": 1, "request": 1}


def test_a_request_that_takes_no_payload_but_declares_one_is_refused_before_any_chunk() -> None:
    params = np.zeros(1000, dtype=np.float32)
    with running_servers(params, SGDRule(lr=1.0)) as (server,):
        connection = ClientConnection(server.address, SECRET, timeout=10)
        declared = {"op": "stats", "seq": 1, "tensors": [["uint8", [1 << 34]]]}
        connection._sock.send(seal(connection._key, declared))
        for _ in range(16):  # chunks that would follow: each fails as a header, none is kept
            connection._sock.send(bytes(CHUNK_BYTES))
        with pytest.raises(ProtocolError, match="'stats' takes no payload"):
            connection.recv()
        deadline = time.monotonic() + 10
        while server.endpoint.rejected["hmac"] < 16 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.endpoint.peer_state["streams"] == 0
        connection.send({"op": "stats", "seq": 2})
        assert connection.recv()[0]["op"] == "ok"  # the connection serves on
        connection.close()


def test_a_connection_cannot_say_done_for_another_worker() -> None:
    params = np.zeros(100, dtype=np.float32)
    with running_servers(params, SGDRule(lr=1.0), expected_workers=2) as (server,):
        victim = PSClient([server.address], SECRET, worker=0, timeout=10)
        victim.register()
        other = PSClient([server.address], SECRET, worker=1, timeout=10)
        other.register()
        with pytest.raises(ProtocolError, match="speaks for worker 1, not for worker 0"):
            other._round_trip("done", [None], {"worker": 0})
        stranger = ClientConnection(server.address, SECRET, timeout=10)  # registered as nobody
        stranger.send({"op": "done", "worker": 0, "incarnation": 0, "seq": 1})
        with pytest.raises(ProtocolError, match="worker 0 is held by another connection"):
            stranger.recv()
        victim.push(np.ones(100, dtype=np.float32))  # worker 0 trains on
        stats = control([server.address], SECRET, "stats")[0]
        for client in (victim, other):
            client.close()
        stranger.close()
    assert stats["live_workers"] == [0, 1]
    assert stats["rejected"]["identity"] == 2


@pytest.mark.parametrize("step", [(1 << 53) + 1, (1 << 64) - 1])
def test_an_absurd_step_is_refused_and_never_applied(step: int) -> None:
    params = np.zeros(100, dtype=np.float32)
    with running_servers(params, SGDRule(lr=1.0)) as (server,):
        client = PSClient([server.address], SECRET, worker=0, timeout=10)
        client.register()
        client.step = step
        with pytest.raises(ProtocolError, match=f"'step' must be <= {1 << 53}, got {step}"):
            client.push(np.ones(100, dtype=np.float32))
        state, meta = fetch_state([server.address], SECRET)
        client.close()
    np.testing.assert_array_equal(state["params"], params)
    assert meta["workers"]["0"]["step"] == 0
