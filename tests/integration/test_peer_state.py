"""What a server keeps per connection ends with the connection: a new peer presenting a closed
connection's routing id continues nothing, tables and open fds stay flat over many
connect-and-close cycles, and a refused stream does not swallow the next request."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from ember.algorithms.rules import SGDRule
from ember.ps import PSClient
from ember.wire import CHUNK_BYTES, ClientConnection, shared
from ember.wire.endpoint import Chunk, Request, ServerEndpoint
from ember.wire.frames import seal
from ember.wire.sessions import CLOSING_SECONDS
from tests.conftest import SECRET, endpoint_process, running_servers
from tests.rogue_peers import Polling, open_fds

pytestmark = pytest.mark.timeout(120)

CYCLES = 1000


def test_a_peer_presenting_a_closed_connections_id_cannot_finish_its_push() -> None:
    endpoint = ServerEndpoint(SECRET, encrypt=False)  # the plain transport: ids can be claimed
    polling = Polling(endpoint)
    context = zmq.Context.instance()
    attacker = context.socket(zmq.DEALER)
    victim = ClientConnection(endpoint.address, SECRET, timeout=5, encrypt=False)
    try:
        polling.take(0.3)  # the victim's bind
        (victim_id,) = endpoint._sessions
        payload = np.ones(2 * CHUNK_BYTES // 4, dtype=np.float32)  # two chunks
        header = {"op": "push", "seq": 1, "tensors": [["float32", [payload.size]]]}
        victim._sock.send(seal(victim._key, header))
        victim._sock.send(payload[: CHUNK_BYTES // 4].tobytes())  # the first chunk only
        started = polling.take(0.5)
        assert [type(e) for e in started] == [Request, Chunk]
        victim.close()
        broken = polling.take(0.5)  # the close is seen, and the id is free again
        assert [(e.index, e.error) for e in broken if isinstance(e, Chunk)] == [
            (1, "connection closed")
        ]
        attacker.setsockopt(zmq.LINGER, 0)
        attacker.setsockopt(zmq.ROUTING_ID, victim_id)
        attacker.connect(endpoint.address)
        attacker.send(bytes(CHUNK_BYTES))  # a second chunk of the right size, no session
        assert polling.take(1.0) == []
        assert sum(endpoint.rejected.values()) >= 1  # it arrived, and was refused
        polling.take(CLOSING_SECONDS)
        assert endpoint.peer_state["sessions"] == 0
    finally:
        polling.stop()
        attacker.close(linger=0)
        victim.close()
        endpoint.close()


@pytest.mark.parametrize("encrypt", [False, True], ids=["plain", "curve"])
def test_tables_return_to_their_size_after_connect_and_close_cycles(
    encrypt: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(shared.DISABLE_VARIABLE, "1")
    params = np.zeros(1000, dtype=np.float32)
    with running_servers(params, SGDRule(lr=0.1)) as (server,):
        endpoint = server.endpoint
        for worker in range(50):
            client = PSClient([server.address], SECRET, worker=worker, timeout=10)
            client.register()
            client.push(np.ones(1000, dtype=np.float32), pull=True)
            client.close()
        deadline = time.monotonic() + 10
        while endpoint.peer_state["sessions"] and time.monotonic() < deadline:
            time.sleep(0.1)
        state = endpoint.peer_state
        assert state["sessions"] == state["streams"] == state["regions"] == 0, state
        assert state["accepted"] == state["bound"] == 0, state


def test_open_fds_of_a_server_process_stay_flat_over_1000_connections_with_regions() -> None:
    with endpoint_process(encrypt=True) as (pid, address):
        warm = ClientConnection(address, SECRET, timeout=10)
        assert warm.share_memory(1 << 16)  # every lazy fd of the process is open after this
        warm.close()
        time.sleep(0.5)
        before = open_fds(pid)
        attached = 0
        for _ in range(CYCLES):
            connection = ClientConnection(address, SECRET, timeout=10)
            attached += connection.share_memory(1 << 16)
            connection.close()
        deadline = time.monotonic() + 20
        while open_fds(pid) > before + 8 and time.monotonic() < deadline:
            time.sleep(0.2)
        after = open_fds(pid)
    assert attached == CYCLES  # each connection really had a region mapped
    assert after <= before + 8, f"{before} open fds before {CYCLES} connections, {after} after"


def test_a_refused_oversize_stream_does_not_swallow_the_next_request() -> None:
    params = np.zeros(1000, dtype=np.float32)
    with running_servers(params, SGDRule(lr=0.1)) as (server,):
        client = PSClient([server.address], SECRET, worker=0, timeout=5)
        client.register()
        connection = client.connections[0]
        # 8 GiB declared, one chunk sent: the push is refused at its header (wrong shape)
        declared = {
            "op": "push",
            "worker": 0,
            "incarnation": client.incarnation,
            "seq": 2,
            "step": 0,
            "keys": [0, 1000],
            "tensors": [["float32", [2 << 30]]],
        }
        connection._sock.send(seal(connection._key, declared))
        connection._sock.send(bytes(CHUNK_BYTES))
        with pytest.raises(Exception, match="refused the request"):
            connection.recv()
        connection.send({"op": "stats", "seq": 3})
        reply, _ = connection.recv()
        assert reply["op"] == "ok"
        assert server.endpoint.peer_state["streams"] == 0
        client.close()
