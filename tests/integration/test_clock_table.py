"""The clock table of a real ParameterServer on 127.0.0.1 does not only grow: joiners that
leave are forgotten, a table of any size is snapshotted, summarized and stopped, registrations
past the bound get a clear error, and BSP and SSP stay exact while joiners come and go."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from ember.algorithms.rules import SGDRule
from ember.checkpoint import load_checkpoint, save_checkpoint, verify_run_state
from ember.errors import ProtocolError
from ember.ps import PSClient, ShardSpec, control, fetch_state, make_consistency
from ember.ps.server import ParameterServer
from ember.wire import ClientConnection
from tests.conftest import SECRET, running_servers
from tests.rogue_peers import join_and_leave

pytestmark = pytest.mark.timeout(180)

F32 = np.float32
JOINER = 1 << 31  # joiners' ids are large, as `ember join` draws them


def _header(op: str, worker: int, seq: int, incarnation: int = 0) -> dict[str, Any]:
    return {"op": op, "worker": worker, "incarnation": incarnation, "seq": seq, "clock": 0}


def _until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.05)


def test_ten_thousand_joins_and_leaves_leave_the_table_flat() -> None:
    with running_servers(np.zeros(8, F32), SGDRule(lr=1.0), expected_workers=2) as (server,):
        connection = ClientConnection(server.address, SECRET, timeout=10)
        deadline = time.monotonic() + 150  # bounded in time as well as in count
        for cycle in range(10_000):
            join_and_leave(connection, JOINER + cycle)
            assert time.monotonic() < deadline, f"only {cycle} cycles in the time allowed"
        connection.close()
        stats = control([server.address], SECRET, "stats")[0]
        assert stats["workers"]["table"] == 2 and stats["workers"]["finished"] == 0
        assert len(server.clocks.entries) == 2
        assert sorted(fetch_state([server.address], SECRET)[1]["workers"]) == ["0", "1"]


def test_snapshot_stats_and_stop_work_at_a_table_of_thirty_thousand(tmp_path) -> None:
    """Thirty thousand entries: their snapshot is megabytes, far past any header's limit."""
    workers = 30_000
    spec = ShardSpec(0, 1, 0, 8)
    server = ParameterServer(
        spec,
        np.zeros(8, F32),
        SGDRule(lr=1.0),
        make_consistency("async"),
        SECRET,
        expected_workers=workers,
    )
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    stopped = False
    try:
        client = PSClient([server.address], SECRET, worker=workers - 1, timeout=30)
        client.register()
        client.step = 7
        client.push(np.ones(8, F32))
        client.close()
        state, meta = fetch_state([server.address], SECRET, timeout=30)
        assert len(meta["workers"]) == workers
        entry = {"clock": 1, "step": 7, "finished": False, "incarnation": 0}
        assert meta["workers"][str(workers - 1)] == entry
        stats = control([server.address], SECRET, "stats", timeout=30)[0]
        assert stats["workers"]["table"] == workers and stats["workers"]["live"] == workers
        assert stats["live_workers"] == list(range(32))  # a bounded sample, not the table
        # what a launcher's checkpoint of it holds, and what a resumed server starts from
        root = save_checkpoint(tmp_path, 1, state, {"workers": meta["workers"]})
        saved = verify_run_state(load_checkpoint(root)).meta["workers"]
        assert saved == meta["workers"]
        final = control([server.address], SECRET, "stop", timeout=30)[0]
        stopped = True
        assert final["workers"]["table"] == workers and len(final["live_workers"]) == 32
    finally:
        if not stopped:
            control([server.address], SECRET, "stop", timeout=5)
        thread.join(10)
    assert not thread.is_alive()


def test_a_registration_past_max_workers_is_refused_naming_the_limit_and_what_to_do() -> None:
    with running_servers(
        np.zeros(4, F32), SGDRule(lr=1.0), expected_workers=2, max_workers=5, worker_timeout=0.5
    ) as (server,):
        connections: dict[int, ClientConnection] = {}  # a connection speaks for one worker

        def register(worker: int) -> None:
            connection = ClientConnection(server.address, SECRET, timeout=5)
            connections[worker] = connection
            connection.send({**_header("register", worker, 1), "step": 0})
            connection.recv()

        try:
            for worker in (JOINER, JOINER + 1, JOINER + 2):
                register(worker)
            with pytest.raises(ProtocolError) as refused:
                register(JOINER + 3)
            message = str(refused.value)
            full = "this shard already holds max_workers=5 workers (2 of the run, 5 live)"
            assert full in message
            assert "let joined workers finish before more join" in message
            stats = control([server.address], SECRET, "stats")[0]
            assert stats["rejected"]["register"] == 1 and stats["workers"]["table"] == 5
            connections[JOINER].send(_header("done", JOINER, 2))
            connections[JOINER].recv()
            join_and_leave(connections[JOINER + 3], JOINER + 3)  # a leaver made room
            # the other two joiners fall silent: dropped, then forgotten to make room
            _until(lambda: control([server.address], SECRET, "stats")[0]["workers"]["dropped"] == 2)
            server.clocks.timeout = 30.0  # from now on nobody falls silent, however slow
            for worker in (JOINER + 4, JOINER + 5, JOINER + 6):
                register(worker)
            assert sorted(server.clocks.entries) == [0, 1, JOINER + 4, JOINER + 5, JOINER + 6]
            with pytest.raises(ProtocolError, match="max_workers=5 workers"):
                register(JOINER + 7)  # all live again: nothing to forget
        finally:
            for connection in connections.values():
                connection.close()


def test_bsp_rounds_stay_exact_while_joiners_come_and_go_and_the_table_stays_flat() -> None:
    params = np.zeros(4, F32)
    with running_servers(params, SGDRule(lr=1.0), "bsp", expected_workers=2) as (server,):
        churn = ClientConnection(server.address, SECRET, timeout=10)
        for cycle in range(100):  # before the rounds: never part of one
            join_and_leave(churn, JOINER + cycle)
        a, b = (PSClient([server.address], SECRET, worker=w, timeout=10) for w in (0, 1))
        a.register()
        b.register()
        a.push(np.ones(4, F32))
        b.push(np.ones(4, F32))  # round 0: 2 workers
        joiner = PSClient([server.address], SECRET, worker=JOINER + 500, timeout=10)
        joiner.register()
        a.push(np.ones(4, F32))
        joiner.push(np.full(4, 4.0, F32))
        joiner.done()  # round 1 counts the joiner's push; it is forgotten afterwards
        b.push(np.ones(4, F32))
        silent = PSClient([server.address], SECRET, worker=JOINER + 501, timeout=10)
        silent.register()  # joins round 2, then says nothing: dropped, the round goes on
        a.push(np.ones(4, F32))
        b.push(np.ones(4, F32))
        server.clocks.timeout = 0.3  # only now: a slow machine must not drop a or b mid-round
        out = np.empty(4, F32)
        a.pull(out)  # waits for round 2 to commit
        rule = SGDRule(lr=1.0)
        expected = np.zeros(4, F32)
        for contributions in ([1.0, 1.0], [1.0, 4.0, 1.0], [1.0, 1.0]):
            expected = _bsp_round(rule, expected, contributions)
        np.testing.assert_array_equal(out, expected)
        assert server.shard.round_count == 0 and server.step == 3
        # the silent one is forgotten after its retention; the run's workers stay
        _until(lambda: sorted(server.clocks.entries) == [0, 1])
        for client in (a, b, joiner, silent):
            client.close()
        churn.close()


def _bsp_round(rule: SGDRule, params: np.ndarray, contributions: list[float]) -> np.ndarray:
    """What one BSP round commits, from a server of the same rule with no joiners at all."""
    with running_servers(params.copy(), rule, "bsp", expected_workers=len(contributions)) as (s,):
        clients = [
            PSClient([s.address], SECRET, worker=w, timeout=10) for w in range(len(contributions))
        ]
        for client in clients:
            client.register()
        for client, value in zip(clients, contributions, strict=True):
            client.push(np.full(params.size, value, F32))
        out = np.empty(params.size, F32)
        clients[0].pull(out)
        for client in clients:
            client.close()
    return out


def test_ssp_holds_a_fast_worker_for_the_slow_one_alone_once_joiners_left() -> None:
    with running_servers(
        np.zeros(2, F32), SGDRule(lr=1.0), "ssp", staleness=1, expected_workers=2
    ) as (server,):
        fast, slow = (PSClient([server.address], SECRET, worker=w, timeout=10) for w in (0, 1))
        fast.register()
        slow.register()
        churn = ClientConnection(server.address, SECRET, timeout=10)
        for cycle in range(200):
            join_and_leave(churn, JOINER + cycle)
        out = np.empty(2, F32)
        fast.push(np.ones(2, F32))  # clock 1: one ahead of the slow worker, allowed
        pulled = threading.Event()

        def pull() -> None:
            fast.push(np.ones(2, F32), reply_into=out, pull=True)  # clock 2: must wait
            pulled.set()

        thread = threading.Thread(target=pull)
        thread.start()
        time.sleep(0.3)
        assert not pulled.is_set(), "the fast worker ran two clocks ahead of the slowest"
        slow.push(np.ones(2, F32))  # the slow worker at clock 1 releases it
        thread.join(10)
        assert pulled.is_set()
        np.testing.assert_array_equal(out, np.full(2, -3.0, F32))
        assert sorted(server.clocks.entries) == [0, 1]
        for client in (fast, slow):
            client.close()
        churn.close()
