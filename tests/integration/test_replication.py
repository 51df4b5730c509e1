"""Shard replication and failover on real servers on 127.0.0.1, and stragglers under SSP,
async and BSP. Gradients are small integers and lr is 1, so every expected value is exact."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from ember.algorithms.rules import EASGDRule, SGDRule
from ember.errors import NotPrimary, ProtocolError, ServerUnavailable
from ember.ps import PSClient, ShardSpec, control, fetch_state, make_consistency
from ember.ps.clockrows import COLUMNS
from ember.ps.server import ParameterServer
from ember.wire import CHUNK_BYTES, ClientConnection
from ember.wire.frames import chunk_frames, describe
from tests.conftest import SECRET, running_servers

pytestmark = pytest.mark.timeout(120)

F32 = np.float32


@dataclass
class Shard:
    primary: ParameterServer
    backup: ParameterServer
    threads: list[threading.Thread]

    def kill_primary(self) -> None:
        """Make the primary leave its serve loop and close its socket, and wait until it has."""
        control([self.primary.address], SECRET, "stop")
        self.threads[1].join(5)
        assert not self.threads[1].is_alive()


@contextmanager
def replicated(
    params: np.ndarray, rule: SGDRule | None = None, consistency: str = "async", **kwargs: Any
) -> Iterator[Shard]:
    """A backup, then a primary that copies its state to it every 50 ms, each on a thread."""
    rule = rule or SGDRule(lr=1.0, momentum=0.0)
    spec = ShardSpec(0, 1, 0, params.size)
    policy = make_consistency(consistency, 0)
    backup = ParameterServer(spec, params, rule, policy, SECRET, role="backup", **kwargs)
    primary = ParameterServer(
        spec, params, rule, policy, SECRET, backup=backup.address, replica_seconds=0.05, **kwargs
    )
    shard = Shard(
        primary, backup, [threading.Thread(target=s.serve, daemon=True) for s in (backup, primary)]
    )
    for thread in shard.threads:
        thread.start()
    try:
        yield shard
    finally:
        for server, thread in reversed(list(zip((backup, primary), shard.threads, strict=True))):
            if thread.is_alive():
                control([server.address], SECRET, "stop", timeout=5)
            thread.join(5)


def _state(address: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    return fetch_state([address], SECRET, timeout=5)


def _await_copy(shard: Shard, timeout: float = 5.0) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Wait until the backup's snapshot equals the primary's; return it."""
    deadline = time.monotonic() + timeout
    while True:
        want, got = _state(shard.primary.address), _state(shard.backup.address)
        if got[1] == want[1] and all(np.array_equal(got[0][k], v) for k, v in want[0].items()):
            return got
        assert time.monotonic() < deadline, f"backup {got[1]} never caught up with {want[1]}"
        time.sleep(0.05)


def _registered(shard: Shard, worker: int = 0) -> PSClient:
    """A client of the shard's primary that has registered (its seq 1)."""
    client = PSClient([shard.primary.address], SECRET, worker=worker, timeout=5)
    client.register()
    return client


def _push_once(shard: Shard, values: np.ndarray, leave: bool = False) -> None:
    """Worker 0 registers, pushes `values` once (and says done if `leave`), and goes."""
    client = _registered(shard)
    client.push(values)
    if leave:
        client.done()
    client.close()


def _header(op: str, seq: int, **extra: Any) -> dict[str, Any]:
    return {"op": op, "worker": 0, "incarnation": 0, "seq": seq, "clock": 0, "step": 0, **extra}


def _until(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.02)


def test_backup_converges_to_the_primary_params_rule_state_step_and_workers() -> None:
    params = np.linspace(-1, 1, 64, dtype=F32)
    with replicated(params, SGDRule(lr=0.1, momentum=0.9)) as shard:
        client = _registered(shard)
        for k in range(5):
            client.step = k + 1
            client.push(np.full(64, k + 1, F32))
        time.sleep(0.3)  # several replica intervals
        state, meta = _await_copy(shard)
        assert sorted(state) == ["momentum", "params"] and meta["step"] == 5
        entry = {"clock": 5, "step": 5, "finished": False, "incarnation": client.incarnation}
        assert meta["workers"] == {"0": entry}
        np.testing.assert_array_equal(shard.backup.clocks.rows(), shard.primary.clocks.rows())
        assert control([shard.backup.address], SECRET, "stats")[0]["counters"]["copies_applied"] > 0
        client.close()


def test_a_backup_refuses_worker_requests_until_promoted_then_serves_the_last_copy() -> None:
    params = np.linspace(-1, 1, 16, dtype=F32)
    with replicated(params) as shard:
        _push_once(shard, np.full(16, 2.0, F32))
        copy, _ = _await_copy(shard)
        connection = ClientConnection(shard.backup.address, SECRET, timeout=5)
        for op in ("register", "push", "pull", "done"):
            arrays = [np.ones(16, F32)] if op == "push" else []
            connection.send(_header(op, 9, keys=[0, 16]), arrays)
            with pytest.raises(NotPrimary):
                connection.recv()
        connection.close()
        # PSClient takes NotPrimary as "wait for a promotion": it retries, then gives up.
        stranded = PSClient([shard.backup.address], SECRET, worker=1, timeout=0.5)
        with pytest.raises(ServerUnavailable, match="is not the primary"):
            stranded.register()
        stranded.close()
        assert control([shard.backup.address], SECRET, "stats")[0]["counters"]["not_primary"] >= 5
        shard.kill_primary()
        control([shard.backup.address], SECRET, "promote")
        client = PSClient([shard.backup.address], SECRET, worker=0, incarnation=1, timeout=5)
        assert client.register()["clock"] == 1  # a restart of worker 0 keeps its copied clock
        out = np.empty(16, dtype=F32)
        client.pull(out)
        np.testing.assert_array_equal(out, copy["params"])
        np.testing.assert_array_equal(out, params - 2.0)
        client.close()


def test_failover_resends_the_push_in_flight_to_the_promoted_backup_exactly_once() -> None:
    with replicated(np.zeros(8, F32)) as shard:
        both = f"{shard.primary.address},{shard.backup.address}"
        client = PSClient([both], SECRET, worker=0, timeout=10)
        client.register()
        for k in (1, 2, 3):  # acknowledged by the primary, reach the backup by copy
            client.push(np.full(8, k, F32))
        copy, meta = _await_copy(shard)
        np.testing.assert_array_equal(copy["params"], np.full(8, -6.0, F32))
        shard.kill_primary()
        _until(client.connections[0]._disconnected)  # the watched connection saw the close
        control([shard.backup.address], SECRET, "promote")
        out = np.empty(8, dtype=F32)
        client.push(np.full(8, 10.0, F32), reply_into=out, pull=True)  # goes to the dead primary
        assert client.failovers == 1
        np.testing.assert_array_equal(out, np.full(8, -16.0, F32))  # copy (1+2+3) then the resend
        client.push(np.full(8, 100.0, F32))  # straight to the new primary
        assert client.failovers == 1
        state, meta = _state(shard.backup.address)
        np.testing.assert_array_equal(state["params"], np.full(8, -116.0, F32))
        assert meta["step"] == 5 and meta["workers"]["0"]["clock"] == 5
        client.close()


def test_a_push_the_primary_held_unanswered_is_applied_once_by_the_promoted_backup() -> None:
    with replicated(np.zeros(4, F32), consistency="bsp", expected_workers=2) as shard:
        both = f"{shard.primary.address},{shard.backup.address}"
        ahead, behind = (PSClient([both], SECRET, worker=w, timeout=15) for w in (0, 1))
        ahead.register()
        behind.register()
        ahead.push(np.full(4, 1.0, F32))  # folded into round 0; the round waits for worker 1
        errors: list[BaseException] = []
        out = np.empty(4, dtype=F32)

        def held_push() -> None:  # worker 0 is a round ahead: the primary holds it, unfolded
            try:
                ahead.push(np.full(4, 10.0, F32), reply_into=out, pull=True)
            except BaseException as exc:
                errors.append(exc)

        pusher = threading.Thread(target=held_push)
        pusher.start()
        _until(lambda: len(shard.primary.pushes.held) == 1)
        copy, meta = _await_copy(shard)  # the open round and worker 0's clock, not the held push
        np.testing.assert_array_equal(copy["params"], np.zeros(4, F32))
        assert shard.backup.shard.round_count == 1 and meta["workers"]["0"]["clock"] == 1
        shard.kill_primary()
        control([shard.backup.address], SECRET, "promote")
        behind.push(np.full(4, 3.0, F32))  # closes round 0 on the backup: -(1 + 3) / 2
        behind.push(np.full(4, 5.0, F32))  # closes round 1 with the resent push: -(10 + 5) / 2
        pusher.join(20)
        assert not pusher.is_alive() and not errors, errors
        assert (ahead.failovers, behind.failovers) == (1, 1)
        np.testing.assert_array_equal(out, np.full(4, -9.5, F32))
        state, meta = _state(shard.backup.address)
        np.testing.assert_array_equal(state["params"], np.full(4, -9.5, F32))
        assert meta["step"] == 2
        for client in (ahead, behind):
            client.close()


def test_a_resend_the_copy_counts_as_answered_is_acknowledged_as_a_duplicate() -> None:
    with replicated(np.zeros(4, F32)) as shard:
        client = _registered(shard)  # seq 1
        client.push(np.full(4, 1.0, F32))  # seq 2
        client.push(np.full(4, 2.0, F32))  # seq 3
        client.close()
        _await_copy(shard)
        shard.kill_primary()
        control([shard.backup.address], SECRET, "promote")
        connection = ClientConnection(shard.backup.address, SECRET, timeout=5)
        connection.send(_header("register", 4))
        connection.recv()
        for seq, value in ((3, 2.0), (2, 1.0)):  # answered by the primary before its last copy
            connection.send(_header("push", seq, keys=[0, 4]), [np.full(4, value, F32)])
            reply, _ = connection.recv()
            assert reply["duplicate"] is True and reply["seq"] == seq
        connection.send(_header("push", 4, keys=[0, 4]), [np.full(4, 4.0, F32)])
        assert "duplicate" not in connection.recv()[0]
        connection.close()
        state, meta = _state(shard.backup.address)
        np.testing.assert_array_equal(state["params"], np.full(4, -7.0, F32))
        assert meta["step"] == 3
        assert control([shard.backup.address], SECRET, "stats")[0]["counters"]["duplicates"] == 2


def test_a_repeated_read_gets_the_current_params_and_a_repeated_easgd_push_gets_zeros() -> None:
    values, out = np.full(8, 3.0, F32), np.empty(8, dtype=F32)
    with replicated(np.zeros(8, F32)) as shard:
        client = _registered(shard)
        client.push(values, reply_into=out, pull=True)
        np.testing.assert_array_equal(out, np.full(8, -3.0, F32))
        out.fill(np.nan)
        client.seq -= 1  # the same push with pull again, as after a reply lost with a server
        client.push(values, reply_into=out, pull=True)
        np.testing.assert_array_equal(out, np.full(8, -3.0, F32))  # read, not applied again
        client.pull(out)
        out.fill(np.nan)
        client.seq -= 1  # the same pull again
        client.pull(out)
        np.testing.assert_array_equal(out, np.full(8, -3.0, F32))
        state, meta = _state(shard.primary.address)
        np.testing.assert_array_equal(state["params"], np.full(8, -3.0, F32))
        assert meta["step"] == 1 and meta["workers"]["0"]["clock"] == 1
        assert control([shard.primary.address], SECRET, "stats")[0]["counters"]["duplicates"] == 2
        client.close()
    with replicated(np.zeros(8, F32), EASGDRule(alpha=0.5)) as shard:
        client = _registered(shard)
        client.push(values, reply_into=out)  # e = 0.5 * (3 - 0); the center moves by e
        np.testing.assert_array_equal(out, np.full(8, 1.5, F32))
        out.fill(np.nan)
        client.seq -= 1
        client.push(values, reply_into=out)  # an elastic step it already took: zero
        np.testing.assert_array_equal(out, np.zeros(8, F32))
        state, meta = _state(shard.primary.address)
        np.testing.assert_array_equal(state["params"], np.full(8, 1.5, F32))
        assert meta["step"] == 1
        assert control([shard.primary.address], SECRET, "stats")[0]["counters"]["duplicates"] == 1
        client.close()


def test_a_copy_with_the_wrong_tensors_is_refused_counted_and_never_touches_the_backup() -> None:
    with replicated(np.zeros(6, F32)) as shard:
        _push_once(shard, np.full(6, 1.0, F32))
        before, before_meta = _await_copy(shard)
        copy = {"op": "replicate", "seq": 0, "step": 99, "round": [0, 0], "workers": {}}
        bad = [
            ({"names": ["params", "momentum"]}, [np.full(6, 99.0, F32)] * 2),
            ({"names": ["params"]}, [np.full(7, 99.0, F32)]),
            ({"names": ["params"]}, [np.full(6, 99, np.float64)]),
        ]
        connection = ClientConnection(shard.backup.address, SECRET, timeout=5)
        for names, arrays in bad:
            connection.send({**copy, **names}, arrays)
            with pytest.raises(ProtocolError, match="a copy for shard 0 must carry"):
                connection.recv()
        connection.close()
        assert control([shard.backup.address], SECRET, "stats")[0]["rejected"]["shape"] == 3
        state, meta = _state(shard.backup.address)
        np.testing.assert_array_equal(state["params"], before["params"])
        assert meta == before_meta
        connection = ClientConnection(shard.primary.address, SECRET, timeout=5)
        connection.send({**copy, "names": ["params"]}, [np.full(6, 99.0, F32)])
        with pytest.raises(ProtocolError, match="is a primary; it takes no copies"):
            connection.recv()
        connection.close()
        np.testing.assert_array_equal(_state(shard.primary.address)[0]["params"], before["params"])
        assert _await_copy(shard)[1] == before_meta  # the backup still takes good copies


def test_a_copy_whose_header_came_before_the_promotion_is_never_applied_after_it() -> None:
    size = CHUNK_BYTES // 4 + 16  # a copy of two chunks: the second can be held back
    out = np.empty(size, dtype=F32)
    with replicated(np.zeros(size, F32)) as shard:
        client = _registered(shard)
        # with pull, the answer comes chunk by chunk as the payload is applied
        client.push(np.full(size, 1.0, F32), reply_into=out, pull=True)
        client.close()
        _await_copy(shard)
        shard.kill_primary()  # its own copies would take the backup's one pending slot
        applied = control([shard.backup.address], SECRET, "stats")[0]["counters"]["copies_applied"]
        stale = [np.full(size, 99.0, F32), shard.backup.clocks.rows()]
        frames = list(chunk_frames(stale))
        assert len(frames) == 3  # two of parameters, one of the clock table
        copy = {"op": "replicate", "seq": 0, "names": ["params"], "step": 99, "round": [0, 0]}
        connection = ClientConnection(shard.backup.address, SECRET, timeout=5)
        connection.send({**copy, "workers": list(COLUMNS), "tensors": describe(stale)})  # header
        connection._sock.send(frames[0], copy=False)
        _until(
            lambda: (c := shard.backup.replication.copy_arriving) is not None and len(c.frames) == 1
        )
        control([shard.backup.address], SECRET, "promote")
        client = PSClient([shard.backup.address], SECRET, worker=0, incarnation=1, timeout=5)
        client.register()
        client.push(np.full(size, 2.0, F32), reply_into=out, pull=True)  # applied and answered
        np.testing.assert_array_equal(out, np.full(size, -3.0, F32))
        for frame in frames[1:]:  # the rest of the copy, now stale
            connection._sock.send(frame, copy=False)
        connection.send({"op": "stats", "seq": 0})  # answered once the chunk is handled
        reply, _ = connection.recv()
        assert "counters" in reply, f"the stale copy was acknowledged: {reply}"
        assert reply["counters"]["copies_applied"] == applied
        connection.close()
        state, meta = _state(shard.backup.address)
        np.testing.assert_array_equal(state["params"], np.full(size, -3.0, F32))
        assert meta["step"] == 2 and meta["workers"]["0"]["clock"] == 2
        client.close()


def _two_workers(consistency: str, staleness: int = 0) -> Any:
    params = np.zeros(8, F32)
    return running_servers(params, SGDRule(lr=1.0), consistency, 1, staleness, expected_workers=2)


def _race(address: str, slow_delays: list[float], fast_pushes: int, size: int = 8) -> Any:
    """Worker 0 pushes ones back to back, worker 1 pushes threes after each delay, both with
    pull; returns when each push was sent and answered, per worker."""
    clients = [PSClient([address], SECRET, worker=w, timeout=20) for w in (0, 1)]
    for client in clients:
        client.register()
    sent: dict[int, list[float]] = {0: [], 1: []}
    replied: dict[int, list[float]] = {0: [], 1: []}
    errors: list[BaseException] = []

    def work(w: int, delays: list[float]) -> None:
        try:
            out = np.empty(size, dtype=F32)
            for delay in delays:
                time.sleep(delay)
                sent[w].append(time.monotonic())
                clients[w].push(np.full(size, 1.0 + 2 * w, F32), reply_into=out, pull=True)
                replied[w].append(time.monotonic())
            clients[w].done()
        except BaseException as exc:
            errors.append(exc)

    jobs = [(0, [0.0] * fast_pushes), (1, slow_delays)]
    threads = [threading.Thread(target=work, args=job) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(t.is_alive() for t in threads) and not errors, errors
    for client in clients:
        client.close()
    return sent, replied


def test_ssp_holds_a_fast_worker_within_s_clocks_of_a_straggler() -> None:
    s, n = 1, 8
    with _two_workers("ssp", staleness=s) as (server,):
        sent, replied = _race(server.address, [0.1] * n, n)
    # The fast worker's c-th answer (it then computes at clock c) needs the straggler's
    # (c - s)-th push: it is never more than s clocks ahead, so it waits for the straggler.
    for c in range(s + 1, n + 1):
        assert sent[1][c - s - 1] <= replied[0][c - 1], c
    assert replied[0][-1] - sent[0][0] > (n - s - 1) * 0.1


def test_async_never_makes_a_fast_worker_wait_for_a_sleeping_straggler() -> None:
    with _two_workers("async") as (server,):
        sent, replied = _race(server.address, [0.0, 1.5], 20)
    assert len(replied[0]) == 20 and replied[0][-1] < sent[1][1]


def test_bsp_makes_a_fast_worker_wait_every_round_and_commits_the_mean_of_each_round() -> None:
    n = 5
    with _two_workers("bsp") as (server,):
        sent, replied = _race(server.address, [0.1] * n, n)
        state, meta = _state(server.address)
    for c in range(1, n + 1):
        assert sent[1][c - 1] <= replied[0][c - 1], c
    np.testing.assert_array_equal(state["params"], np.full(8, -2.0 * n, F32))  # (1 + 3) / 2
    assert meta["step"] == n


def _copies(shard: Shard) -> int:
    return control([shard.backup.address], SECRET, "stats")[0]["counters"].get("copies_applied", 0)


def test_a_worker_that_dies_mid_stream_does_not_stop_replication_once_replaced() -> None:
    size = CHUNK_BYTES // 4 + 16  # two chunks: the primary folds the first, then waits
    with replicated(np.zeros(size, F32)) as shard:
        dying = ClientConnection(shard.primary.address, SECRET, timeout=5)
        dying.send(_header("register", 1))
        dying.recv()
        payload = [np.ones(size, F32)]
        dying.send(_header("push", 2, keys=[0, size], tensors=describe(payload)))
        dying._sock.send(next(chunk_frames(payload)), copy=False)  # then the process "dies"
        _until(lambda: any(h.offset > 0 for h in shard.primary.pushes.arriving.values()))
        stuck = _copies(shard)
        time.sleep(0.3)  # six intervals: at most the copy already in flight lands
        assert _copies(shard) <= stuck + 1
        replacement = ClientConnection(shard.primary.address, SECRET, timeout=5)
        replacement.send(_header("register", 1, incarnation=1))
        replacement.recv()
        before = _copies(shard)
        _until(lambda: _copies(shard) >= before + 2)
        assert not shard.primary.pushes.arriving and not shard.primary.endpoint._streams
        for connection in (dying, replacement):
            connection.close()


def test_done_resent_to_a_promoted_backup_that_saw_the_worker_leave_or_never_join_is_ok() -> None:
    with replicated(np.zeros(4, F32)) as shard:
        _push_once(shard, np.full(4, 1.0, F32), leave=True)
        _await_copy(shard)
        shard.kill_primary()
        control([shard.backup.address], SECRET, "promote")
        connection = ClientConnection(shard.backup.address, SECRET, timeout=5)
        for worker in (0, 7):  # worker 0 left before the last copy; 7 never registered
            connection.send(_header("done", 3, worker=worker))
            assert connection.recv()[0] == {"op": "ok"}
        connection.close()
        assert control([shard.backup.address], SECRET, "stats")[0]["live_workers"] == []


def test_a_backup_never_drops_workers_for_silence_once_copies_stop() -> None:
    with replicated(np.zeros(4, F32), worker_timeout=0.3) as shard:
        shard.primary.clocks.timeout = 60.0  # only the backup may time workers out
        clients = [PSClient([shard.primary.address], SECRET, worker=w, timeout=5) for w in (0, 1)]
        for client in clients:
            client.register()
            client.push(np.full(4, 1.0, F32))
        _await_copy(shard)
        shard.kill_primary()  # no more copies
        stats = control([shard.backup.address], SECRET, "stats")[0]
        assert stats["live_workers"] == [0, 1]
        time.sleep(1.0)  # more than three timeouts, several serve-loop turns
        stats = control([shard.backup.address], SECRET, "stats")[0]
        assert stats["live_workers"] == [0, 1]
        assert not [e for e in stats["events"] if e["event"] == "drop"]
        for client in clients:
            client.close()


_GOOD_ROWS = np.array([[0, 0, 2, 5, 4, 1, 0]], dtype=np.int64)  # see ember.ps.clockrows.COLUMNS

MALFORMED_COPIES = [
    ({"workers": []}, None, "workers must name the clock table's columns ["),
    ({"workers": None}, None, "workers must name the clock table's columns ["),
    ({"workers": 5}, None, "workers must name the clock table's columns ["),
    ({}, np.zeros((1, 5), np.int64), "workers must be a tensor ['int64', [64, 7]], got "),
    ({}, _GOOD_ROWS.astype(np.float32), "workers must be a tensor ['int64', [64, 7]], got "),
    ({}, np.zeros((65, 7), np.int64), "workers has 65 rows, more than the 64 allowed"),
    ({}, np.repeat(_GOOD_ROWS, 2, axis=0), "workers: worker 0 has more than one row"),
    ({}, _GOOD_ROWS * [1, 1, 1, 1, 1, 3, 1], "workers: live must be 0 or 1, got 3"),
    ({}, _GOOD_ROWS - [5, 0, 0, 0, 0, 0, 0], "workers: worker -5 is outside [0, "),
    ({"round": "12"}, None, "round must be [count, clock], got '12'"),
    ({"round": [1.5, 0]}, None, "round must be [count, clock], got [1.5, 0]"),
    ({"round": None}, None, "round must be [count, clock], got None"),
    ({"step": True}, None, "step is True"),
    ({"step": -1}, None, "step is -1"),
]


@pytest.mark.parametrize(("fields", "rows", "message"), MALFORMED_COPIES)
def test_a_malformed_copy_is_refused_and_the_backup_then_takes_a_good_one(
    fields: dict[str, Any], rows: np.ndarray | None, message: str
) -> None:
    params = np.zeros(6, F32)
    good = {"op": "replicate", "seq": 0, "names": ["params"], "step": 3, "round": [0, 0]}
    good["workers"] = list(COLUMNS)
    with running_servers(params, SGDRule(lr=1.0), role="backup", max_workers=64) as (backup,):
        connection = ClientConnection(backup.address, SECRET, timeout=5)
        table = _GOOD_ROWS if rows is None else rows
        connection.send({**good, **fields}, [np.full(6, 99.0, F32), table])
        with pytest.raises(ProtocolError) as refused:
            connection.recv()
        assert f"malformed copy of shard 0: {message}" in str(refused.value)
        assert _state(backup.address)[1]["step"] == 0  # nothing of it was applied
        connection.send(good, [np.full(6, 7.0, F32), _GOOD_ROWS])
        assert connection.recv()[0] == {"op": "ok", "step": 3}
        connection.close()
        state, meta = _state(backup.address)
    np.testing.assert_array_equal(state["params"], np.full(6, 7.0, F32))
    assert meta["workers"]["0"] == {"clock": 2, "step": 5, "finished": False, "incarnation": 0}


@pytest.mark.parametrize("backup", [5, ["tcp://x"], "nowhere"])
def test_a_promotion_naming_a_malformed_backup_is_refused_and_the_server_serves_on(
    backup: object,
) -> None:
    with running_servers(np.zeros(4, F32), SGDRule(lr=1.0), role="backup") as (server,):
        with pytest.raises(ProtocolError, match=r"backup must be a tcp:// address, got "):
            control([server.address], SECRET, "promote", fields={"backup": backup})
        assert control([server.address], SECRET, "stats")[0]["role"] == "backup"
