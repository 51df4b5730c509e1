"""A real ParameterServer on 127.0.0.1: authentication, bad frames, duplicates, liveness."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest
import zmq

from ember.algorithms.rules import EASGDRule, SGDRule
from ember.errors import ProtocolError, ServerUnavailable
from ember.ps import PSClient, control, fetch_state
from ember.ps.shard import BLOCK
from ember.wire import (
    CHUNK_BYTES,
    ClientConnection,
    gather,
    shared,
    tensors_from_frames,
)
from ember.wire import connection as wire_connection
from ember.wire.frames import seal
from tests.conftest import SECRET, running_servers

pytestmark = pytest.mark.timeout(60)


def _params(n: int = 1000) -> np.ndarray:
    return np.linspace(-1, 1, n, dtype=np.float32)


def _pull(address_list: list[str], n: int, worker: int = 99) -> np.ndarray:
    client = PSClient(address_list, SECRET, worker=worker, timeout=5)
    client.register()
    out = np.empty(n, dtype=np.float32)
    client.pull(out)
    client.close()
    return out


# Under --encrypt off the HMAC handshake is the only guard (with CURVE, test_transport.py):
# a raw zmq peer reaches it.
@pytest.mark.usefixtures("plain_transport")
def test_garbage_wrong_secret_and_forged_headers_are_rejected_and_counted() -> None:
    params = _params()
    with running_servers(params, SGDRule(lr=1.0)) as (server,):
        raw = zmq.Context.instance().socket(zmq.DEALER)
        raw.connect(server.address)
        raw.send_multipart([b"\x00random bytes", b"more"])  # before any handshake
        raw.send_multipart([seal(b"guess" * 7, {"op": "stop"})])
        with pytest.raises(ProtocolError, match="refused the run's secret"):
            ClientConnection(server.address, b"w" * 32, timeout=2)
        forged = ClientConnection(server.address, SECRET, timeout=2)
        forged._key = b"f" * 32  # authenticated connection, headers sealed with a wrong key
        forged.send({"op": "stop", "seq": 1})
        with pytest.raises(ServerUnavailable):
            forged.recv(timeout=0.5)
        stats = control([server.address], SECRET, "stats")[0]
        assert stats["rejected"]["unauthenticated"] >= 2
        assert stats["rejected"]["hmac"] == 1
        np.testing.assert_array_equal(_pull([server.address], params.size), params)
        raw.close(linger=0)
        forged.close()


def test_push_with_wrong_shape_or_dtype_is_refused_and_parameters_stay_untouched() -> None:
    params = _params()
    with running_servers(params, SGDRule(lr=1.0)) as (server,):
        client = PSClient([server.address], SECRET, worker=0, timeout=5)
        client.register()
        for bad in (np.ones(999, np.float32), np.ones(1000, np.float64)):
            with pytest.raises(ProtocolError, match="must carry one float32 tensor of shape"):
                client.push(bad)
        client.close()
        assert control([server.address], SECRET, "stats")[0]["rejected"]["shape"] == 2
        np.testing.assert_array_equal(_pull([server.address], params.size), params)


@pytest.mark.usefixtures("plain_transport")
def test_frame_larger_than_the_limit_drops_that_peer_and_the_server_keeps_serving() -> None:
    params = _params()
    with running_servers(params, SGDRule(lr=1.0)) as (server,):
        raw = zmq.Context.instance().socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(server.address)
        raw.send(b"x" * (8 << 20))
        time.sleep(0.3)
        np.testing.assert_array_equal(_pull([server.address], params.size), params)
        raw.close()


def test_repeated_push_is_acknowledged_and_not_applied_twice() -> None:
    params = np.zeros(10, dtype=np.float32)
    with running_servers(params, SGDRule(lr=1.0)) as (server,):
        client = PSClient([server.address], SECRET, worker=0, timeout=5)
        client.register()
        connection = client.connections[0]
        header = {
            "op": "push",
            "worker": 0,
            "incarnation": 0,
            "seq": 1,
            "clock": 0,
            "step": 1,
            "keys": [0, 10],
        }
        grad = np.ones(10, dtype=np.float32)
        for _ in range(2):
            connection.send(header, [grad])
            reply, _ = connection.recv()
        assert reply.get("duplicate") is True
        client.close()
        np.testing.assert_array_equal(_pull([server.address], 10), -np.ones(10, np.float32))


def test_silent_worker_is_dropped_so_a_bsp_peer_does_not_wait_forever() -> None:
    params = np.zeros(10, dtype=np.float32)
    with running_servers(params, SGDRule(lr=1.0), "bsp", worker_timeout=1.0) as (server,):
        silent = PSClient([server.address], SECRET, worker=1, timeout=5)
        silent.register()
        time.sleep(1.2)  # worker 1 says nothing after registering
        active = PSClient([server.address], SECRET, worker=0, timeout=10)
        active.register()
        out = np.empty(10, dtype=np.float32)
        started = time.monotonic()
        active.push(np.ones(10, np.float32), reply_into=out, pull=True)
        assert time.monotonic() - started < 5
        np.testing.assert_array_equal(out, -np.ones(10, np.float32))
        events = control([server.address], SECRET, "stats")[0]["events"]
        assert any(e["event"] == "drop" and e["worker"] == 1 for e in events)
        silent.close()
        active.close()


def test_two_shards_each_hold_a_key_range_and_a_pull_returns_the_whole_vector() -> None:
    params = _params(1001)
    with running_servers(params, SGDRule(lr=0.5), shards=2) as servers:
        addresses = [s.address for s in servers]
        client = PSClient(addresses, SECRET, worker=0, timeout=5)
        client.register()
        assert client.ranges == [(0, 500), (500, 1001)]
        out = np.empty_like(params)
        client.push(np.full(1001, 2.0, np.float32), reply_into=out, pull=True)
        np.testing.assert_allclose(out, params - 1.0)
        client.close()


def test_unreachable_server_is_a_clear_error_naming_its_address() -> None:
    with pytest.raises(ServerUnavailable, match=r"tcp://127.0.0.1:1 did not answer within 0.5s"):
        ClientConnection("tcp://127.0.0.1:1", SECRET, timeout=0.5)


def test_ssp_never_lets_a_worker_run_more_than_s_clocks_ahead_of_the_slowest() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=12, deadline=None)
    @given(
        st.sampled_from([0, 1, 3]),
        st.lists(st.lists(st.floats(0, 0.004), min_size=12, max_size=12), min_size=3, max_size=3),
    )
    def check(staleness: int, delays: list[list[float]]) -> None:
        consistency = "bsp" if staleness == 0 else "ssp"
        sent: dict[int, list[float]] = {w: [] for w in range(3)}
        replied: dict[int, list[float]] = {w: [] for w in range(3)}
        params = np.zeros(64, dtype=np.float32)
        with running_servers(params, SGDRule(lr=0.01), consistency, staleness=staleness) as (s,):
            clients = [PSClient([s.address], SECRET, worker=w, timeout=10) for w in range(3)]
            for client in clients:
                client.register()

            def work(w: int) -> None:
                out = np.empty(64, dtype=np.float32)
                for delay in delays[w]:
                    time.sleep(delay)
                    sent[w].append(time.monotonic())
                    clients[w].push(np.ones(64, np.float32), reply_into=out, pull=True)
                    replied[w].append(time.monotonic())
                clients[w].done()

            threads = [threading.Thread(target=work, args=(w,)) for w in range(3)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            for client in clients:
                client.close()
        # Worker w computing at clock c (after its c-th reply) needs every other worker to have
        # sent its (c - s)-th push before that reply came back.
        for w in range(3):
            for c, reply_time in enumerate(replied[w], start=1):
                for other in range(3):
                    needed = c - staleness
                    if other != w and needed >= 1:
                        assert sent[other][needed - 1] <= reply_time, (w, c, other)

    check()


def test_a_round_completed_by_a_leaving_worker_is_committed() -> None:
    params = np.zeros(4, dtype=np.float32)
    with running_servers(params, SGDRule(lr=1.0), "bsp", expected_workers=2) as (server,):
        stays, leaves = (PSClient([server.address], SECRET, worker=w, timeout=5) for w in (0, 1))
        stays.register()
        leaves.register()
        stays.push(np.ones(4, np.float32))  # round 0 now waits only for worker 1
        leaves.done()
        out = np.empty(4, dtype=np.float32)
        stays.pull(out)
        np.testing.assert_array_equal(out, -np.ones(4, np.float32))
        stays.close()
        leaves.close()


def test_a_new_incarnation_voids_what_its_predecessor_left_held_and_refuses_its_late_push() -> None:
    params = np.zeros(1, dtype=np.float32)
    with running_servers(params, SGDRule(lr=1.0), "ssp", expected_workers=2) as (server,):
        steady = PSClient([server.address], SECRET, worker=0, timeout=5)
        steady.register()
        old = PSClient([server.address], SECRET, worker=1, incarnation=0, timeout=5)
        old.register()
        old.push(np.ones(1, np.float32))  # clock 0 -> 1
        old.connections[0].send(  # held: under SSP(0) worker 1 is now one clock ahead
            {
                "op": "push",
                "worker": 1,
                "incarnation": 0,
                "seq": 99,
                "clock": 1,
                "step": 2,
                "keys": [0, 1],
            },
            [np.full(1, 10.0, np.float32)],
        )
        time.sleep(0.2)
        new = PSClient([server.address], SECRET, worker=1, incarnation=1, timeout=5)
        assert new.register()["clock"] == 1  # the restart keeps its progress
        pusher = threading.Thread(target=new.push, args=(np.full(1, 10.0, np.float32),))
        pusher.start()
        steady.push(np.ones(1, np.float32))
        steady.push(np.ones(1, np.float32))
        pusher.join(10)
        state, _ = fetch_state([server.address], SECRET)
        np.testing.assert_array_equal(state["params"], [-13.0])  # 1 + 1 + 10 + 1, not + 10 more
        with pytest.raises(ProtocolError, match="worker 1 is held by another connection"):
            old.push(np.full(1, 100.0, np.float32))  # a late push of the old incarnation
        state, _ = fetch_state([server.address], SECRET)
        np.testing.assert_array_equal(state["params"], [-13.0])
        for client in (steady, old, new):
            client.close()


def test_a_dropped_worker_that_speaks_again_rejoins_level_with_the_slowest() -> None:
    params = np.zeros(2, dtype=np.float32)
    with running_servers(params, SGDRule(lr=1.0), "async", worker_timeout=0.5) as (server,):
        client = PSClient([server.address], SECRET, worker=0, timeout=5)
        client.register()
        time.sleep(1.0)  # dropped for silence
        client.push(np.ones(2, np.float32))  # accepted: it is back
        events = control([server.address], SECRET, "stats")[0]["events"]
        assert [e["event"] for e in events][-2:] == ["drop", "rejoin"]
        client.close()


def test_a_reply_still_being_sent_never_sees_a_later_update(monkeypatch) -> None:
    size = 4 * CHUNK_BYTES // 4 + 1024  # several full chunks and a small tail
    params = np.zeros(size, dtype=np.float32)
    monkeypatch.setenv(shared.DISABLE_VARIABLE, "0")  # replies that zmq reads from memory
    with running_servers(params, SGDRule(lr=1.0), "async") as (server,):
        plain_socket = wire_connection.new_socket

        def slow_socket(context: zmq.Context, kind: int) -> zmq.Socket:
            sock = plain_socket(context, kind)  # tiny buffers keep zmq inside the replies
            sock.setsockopt(zmq.RCVHWM, 1)
            sock.setsockopt(zmq.RCVBUF, 4096)
            return sock

        monkeypatch.setattr(wire_connection, "new_socket", slow_socket)
        reader = PSClient([server.address], SECRET, worker=0, timeout=10)
        monkeypatch.setattr(wire_connection, "new_socket", plain_socket)
        reader.register()
        connection = reader.connections[0]
        for seq in (10, 11, 12):
            connection.send(
                {"op": "pull", "worker": 0, "incarnation": 0, "seq": seq, "clock": 0, "step": 0}
            )
        time.sleep(0.5)
        writer = PSClient([server.address], SECRET, worker=1, timeout=10)
        writer.register()
        writer.push(np.ones(size, np.float32))  # parameters become -1 while replies are queued
        for _ in range(3):
            header, frames = connection.recv()
            out = np.empty(size, dtype=np.float32)
            gather(tensors_from_frames(header["tensors"], frames, 4 * size)[0], out)
            assert np.unique(out).tolist() == [0.0], header["seq"]
        reader.close()
        writer.close()


def test_a_multi_chunk_push_is_folded_and_answered_chunk_by_chunk_exactly() -> None:
    size = 2 * CHUNK_BYTES // 4 + 777  # three chunks
    params = np.linspace(-1, 1, size, dtype=np.float32)
    with running_servers(params, SGDRule(lr=0.5), "async") as (server,):
        client = PSClient([server.address], SECRET, worker=0, timeout=10)
        client.register()
        grad = np.linspace(2, -2, size, dtype=np.float32)
        out = np.empty(size, dtype=np.float32)
        client.push(grad, reply_into=out, pull=True)
        np.testing.assert_allclose(out, params - 0.5 * grad, rtol=1e-6, atol=1e-6)
        assert control([server.address], SECRET, "stats")[0]["counters"]["streamed"] == 1
        client.close()


@pytest.mark.parametrize(
    "rule",
    [SGDRule(lr=0.5), SGDRule(lr=0.5, momentum=0.5), EASGDRule(alpha=0.5)],
    ids=["sgd", "momentum", "easgd"],
)
def test_over_the_socket_each_streamed_reply_chunk_is_the_folds_result(monkeypatch, rule) -> None:
    """Chunk k's reply leaves while chunk k + 1 is still arriving, and lands straight in the
    caller's array: it must be exactly what the fold made of chunk k, a refused block of it
    included (the fold commits and checks BLOCK keys at a time)."""
    monkeypatch.setenv(shared.DISABLE_VARIABLE, "0")  # every payload and reply on the socket
    chunk = CHUNK_BYTES // 4
    size = 2 * chunk + 777  # three chunks
    params = np.linspace(-1, 1, size, dtype=np.float32)
    easgd = isinstance(rule, EASGDRule)
    with running_servers(params, rule, "async") as (server,):
        client = PSClient([server.address], SECRET, worker=0, timeout=10)
        client.register()
        assert not client.connections[0].shared
        model, momentum = params.copy(), np.zeros(size, np.float32)
        for step in range(3):
            values = np.linspace(2, -2, size, dtype=np.float32) * np.float32(step + 1)
            if step == 1:
                values[chunk + 5] = np.nan  # its block of the middle chunk is refused alone
            out = np.full(size, np.inf, np.float32)
            client.push(values, reply_into=out, pull=not easgd)
            expected = np.zeros(size, np.float32) if easgd else model
            for start in range(0, size, BLOCK):
                keys = slice(start, start + BLOCK)
                if not np.isfinite(values[keys]).all():
                    if not easgd:
                        expected[keys] = model[keys]
                    continue
                if easgd:
                    expected[keys] = np.float32(0.5) * (values[keys] - model[keys])
                    model[keys] += expected[keys]
                else:
                    momentum[keys] = np.float32(rule.momentum) * momentum[keys] + values[keys]
                    model[keys] -= np.float32(0.5) * momentum[keys]
            np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
            state, _ = fetch_state([server.address], SECRET)
            np.testing.assert_allclose(state["params"], model, rtol=1e-6, atol=1e-6)
            if not easgd:  # the pulled parameters are the fold's result itself
                np.testing.assert_array_equal(out, state["params"])
        stats = control([server.address], SECRET, "stats")[0]
        client.close()
    assert stats["counters"]["streamed"] == 3
    assert stats["rejected"] == {"nonfinite": 1}


def test_a_chunk_of_the_wrong_size_ends_its_push_with_an_error_and_the_server_serves_on() -> None:
    size = CHUNK_BYTES // 4 + 10  # two chunks
    params = np.zeros(size, dtype=np.float32)
    with running_servers(params, SGDRule(lr=1.0), "bsp", expected_workers=1) as (server,):
        client = PSClient([server.address], SECRET, worker=0, timeout=5)
        client.register()
        connection = client.connections[0]
        header = {
            "op": "push",
            "worker": 0,
            "incarnation": 0,
            "seq": 5,
            "clock": 0,
            "step": 1,
            "keys": [0, size],
            "tensors": [["float32", [size]]],
        }
        connection._sock.send(seal(connection._key, header))
        connection._sock.send(b"\x00" * CHUNK_BYTES)
        connection._sock.send(b"\x00" * 12)  # the header declared 40 bytes
        with pytest.raises(ProtocolError, match="payload frame 1 has 12 bytes, header declares 40"):
            connection.recv()
        out = np.empty(size, dtype=np.float32)
        client.seq = 5  # the hand-made push used sequence number 5
        client.pull(out)  # the connection and the server both carry on
        np.testing.assert_array_equal(out, params)  # a BSP push is applied only when complete
        client.close()


def test_a_sequence_number_far_past_the_window_is_refused_and_later_pushes_still_apply() -> None:
    params = np.zeros(10, dtype=np.float32)
    with running_servers(params, SGDRule(lr=1.0)) as (server,):
        client = PSClient([server.address], SECRET, worker=0, timeout=5)
        client.register()
        client.push(np.ones(10, np.float32))
        forged = {"op": "pull", "worker": 0, "incarnation": 0, "seq": 1 << 62, "step": 1}
        client.connections[0].send(forged)
        message = f"worker 0 sequence number {1 << 62} is more than 1048576 past its last, 2"
        with pytest.raises(ProtocolError, match=f"refused the request: {message}$"):
            client.connections[0].recv()
        for _ in range(5):
            client.push(np.ones(10, np.float32))
        client.close()
        # a registration anchors a new incarnation's window wherever its numbers are (as a
        # long-running worker's are at a server restarted from a checkpoint), and they apply
        again = PSClient([server.address], SECRET, worker=0, incarnation=1, timeout=5)
        again.seq = 3 << 20
        again.register()
        again.push(np.ones(10, np.float32))
        again.close()
        stats = control([server.address], SECRET, "stats")[0]
        np.testing.assert_array_equal(_pull([server.address], 10), np.full(10, -7, np.float32))
    assert stats["rejected"]["seq"] == 1
    assert "duplicates" not in stats["counters"]


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ({"op": "register", "worker": -1}, "header field 'worker' must be >= 0, got -1"),
        ({"op": "register", "incarnation": -1}, "header field 'incarnation' must be >= 0, got -1"),
        ({"op": "register", "seq": "1"}, "header field 'seq' must be an integer, got '1'"),
        ({"op": "pull", "pull": [1]}, "header field 'pull' must be true or false, got [1]"),
        ({"op": "pull", "step": None}, "header field 'step' must be an integer, got None"),
        ({"op": "done", "worker": [0]}, "header field 'worker' must be an integer, got [0]"),
        ({"op": "nothing"}, "unknown op 'nothing'"),
    ],
)
def test_a_request_with_a_malformed_field_is_refused_and_the_server_serves_on(
    header: dict[str, object], message: str
) -> None:
    params = _params(10)
    with running_servers(params, SGDRule(lr=1.0)) as (server,):
        client = PSClient([server.address], SECRET, worker=0, timeout=5)
        client.register()
        fields = {"worker": 0, "incarnation": 0, "seq": 5, "step": 0, **header}
        client.connections[0].send(fields)
        with pytest.raises(ProtocolError, match=f"refused the request: {re.escape(message)}$"):
            client.connections[0].recv()
        client.push(np.ones(10, np.float32))
        client.close()
        np.testing.assert_array_equal(_pull([server.address], 10), params - 1)
