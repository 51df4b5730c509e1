"""Compressed exchanges with real servers on 127.0.0.1: the error-feedback oracle through the
wire, views and mirrors bit-identical on both sides, and full-precision resynchronization."""

from __future__ import annotations

import numpy as np
import pytest

from ember.algorithms.rules import EASGDRule, SGDRule
from ember.errors import ProtocolError
from ember.ps import PSClient, control, fetch_state
from ember.ps.server import ParameterServer
from ember.wire import ClientConnection
from tests.conftest import SECRET, running_servers
from tests.integration.test_replication import _await_copy, _header, _until, replicated

pytestmark = pytest.mark.timeout(120)

F32 = np.float32
EPS32 = float(np.finfo(F32).eps)
SIZE = 3 * 4096 + 77  # several int8 blocks, the last one partial


def _client(server: ParameterServer | str, kind: str, differences: bool = False) -> PSClient:
    address = server if isinstance(server, str) else server.address
    client = PSClient(
        [address], SECRET, worker=0, timeout=10, compress=kind, differences=differences
    )
    client.register()
    return client


def _view(server: ParameterServer, client: PSClient) -> np.ndarray | None:
    """The server's view (or mirror) of the client, whose only connection is its first."""
    views = server.pushes.views._views
    return None if 0 not in views else views[0].values


@pytest.mark.parametrize("kind", ["fp16", "int8"])
def test_error_feedback_through_a_server_loses_nothing_of_the_gradients(kind: str) -> None:
    """lr 1 and no momentum: the server's parameters fall by exactly the sum it received, so
    p0 - params + residual is the sum of the gradients the worker meant to send."""
    rng = np.random.default_rng(0)
    with running_servers(np.zeros(SIZE, F32), SGDRule(lr=1.0)) as (server,):
        client = _client(server, kind)
        meant, bound = np.zeros(SIZE), np.zeros(SIZE)
        for _ in range(100):
            g = (rng.normal(size=SIZE) * rng.uniform(0.01, 1)).astype(F32)
            meant += g
            bound += EPS32 * (np.abs(meant) + np.abs(g) + 1)  # float32 adds, worker and server
            result = client.push(g)
            assert result.bytes_pushed == g.nbytes // (2 if kind == "fp16" else 4) + (
                0 if kind == "fp16" else 4 * 4
            )
        received = -fetch_state([server.address], SECRET, timeout=5)[0]["params"].astype(float)
        residual = client.links[0].residual  # type: ignore[index]
        assert np.all(np.abs(received + residual - meant) <= bound)
        assert np.any(np.abs(received - meant) > 0)  # rounding did drop something each push
        client.done()
        client.close()
        assert len(server.pushes.views) == 0  # released when the worker left


@pytest.mark.parametrize("kind", ["bf16", "int8"])
def test_pulled_parameters_and_the_servers_view_stay_bit_identical(kind: str) -> None:
    rng = np.random.default_rng(1)
    with running_servers(rng.normal(size=SIZE).astype(F32), SGDRule(lr=0.1)) as (server,):
        client = _client(server, kind)
        params = np.empty(SIZE, F32)
        full = client.pull(params)  # the first pull is full precision
        assert full.bytes_pulled == 4 * SIZE and client.links[0].synced  # type: ignore[index]
        for _ in range(200):
            result = client.push(rng.normal(size=SIZE).astype(F32), reply_into=params, pull=True)
            assert result.bytes_pulled < 2 * SIZE + 100  # the difference, encoded
            np.testing.assert_array_equal(params, _view(server, client))
        # rounding self-corrects: with no updates in between, pulls close the gap to zero
        truth = server.params
        gap = [np.abs(params - truth).max()]
        for _ in range(3):
            client.pull(params)
            gap.append(np.abs(params - truth).max())
        assert gap[-1] < gap[0] / 100 or gap[-1] == 0
        client.close()


@pytest.mark.parametrize("consistency", ["async", "bsp"])
def test_easgd_mirrors_stay_identical_and_the_center_moves_by_what_the_worker_applies(
    consistency: str,
) -> None:
    rng = np.random.default_rng(2)
    center0 = np.zeros(SIZE, F32)
    with running_servers(center0, EASGDRule(alpha=0.5), consistency, expected_workers=1) as (
        server,
    ):
        client = _client(server, "int8", differences=True)
        x, elastic = rng.normal(size=SIZE).astype(F32), np.empty(SIZE, F32)
        moved = np.zeros(SIZE)
        for step in range(50):
            first = client.push(x, reply_into=elastic)
            if step == 0:
                assert first.bytes_pushed == 4 * SIZE  # the mirror is made in full precision
            x -= elastic
            moved += elastic
            np.testing.assert_array_equal(client.links[0].mirror, _view(server, client))  # type: ignore[index]
            x += (rng.normal(size=SIZE) * 0.01).astype(F32)  # local steps
        center = server.params.astype(float)
        assert np.abs(center - moved).max() <= 50 * EPS32 * (np.abs(moved).max() + 1)
        assert first.bytes_pushed < SIZE + 100
        client.close()


def test_a_failover_resends_in_full_precision_and_views_start_again() -> None:
    rng = np.random.default_rng(3)
    with replicated(np.zeros(SIZE, F32)) as shard:
        both = f"{shard.primary.address},{shard.backup.address}"
        client = PSClient([both], SECRET, worker=0, timeout=10, compress="int8")
        client.register()
        params = np.empty(SIZE, F32)
        client.pull(params)
        for _ in range(5):
            client.push(rng.normal(size=SIZE).astype(F32), reply_into=params, pull=True)
        _await_copy(shard)
        shard.kill_primary()
        _until(client.connections[0]._disconnected)
        control([shard.backup.address], SECRET, "promote")
        result = client.push(rng.normal(size=SIZE).astype(F32), reply_into=params, pull=True)
        assert client.failovers == 1 and result.bytes_pulled == 4 * SIZE  # full precision
        np.testing.assert_array_equal(params, shard.backup.params)
        np.testing.assert_array_equal(params, _view(shard.backup, client))
        result = client.push(rng.normal(size=SIZE).astype(F32), reply_into=params, pull=True)
        assert result.bytes_pulled < SIZE + 100  # encoded again, from the new view
        np.testing.assert_array_equal(params, _view(shard.backup, client))
        client.close()


def test_a_repeated_easgd_push_resyncs_its_mirror_and_a_difference_without_one_is_refused() -> None:
    rng = np.random.default_rng(4)
    with running_servers(np.zeros(SIZE, F32), EASGDRule(alpha=0.5)) as (server,):
        client = _client(server, "int8", differences=True)
        x, elastic = rng.normal(size=SIZE).astype(F32), np.empty(SIZE, F32)
        for _ in range(3):
            client.push(x, reply_into=elastic)
            x -= elastic
        client.seq -= 1  # the same push again, as after a reply lost with a server
        client.push(x, reply_into=elastic)
        assert not elastic.any() and not client.links[0].synced  # type: ignore[index]
        assert _view(server, client) is None  # a duplicate cannot make a mirror
        resync = client.push(x, reply_into=elastic)
        assert resync.bytes_pushed == 4 * SIZE
        x -= elastic
        np.testing.assert_array_equal(client.links[0].mirror, _view(server, client))  # type: ignore[index]
        # a raw connection, which takes worker 0 over as a restart would, sending a difference
        # the server holds no mirror for (the mirror is the old connection's)
        connection = ClientConnection(server.address, SECRET, timeout=5)
        connection.send(_header("register", client.seq + 1))
        assert connection.recv()[0]["op"] == "ok"
        connection.send(
            _header("push", client.seq + 2, keys=[0, SIZE], codec="int8"),
            [np.zeros(SIZE + 16, np.uint8)],
        )
        with pytest.raises(ProtocolError, match="holds no mirror"):
            connection.recv()
        connection.close()
        assert control([server.address], SECRET, "stats")[0]["rejected"]["view"] == 1
        client.close()


def test_shared_memory_and_the_socket_carry_the_same_encoded_exchange(monkeypatch) -> None:
    finals = []
    for shm in ("1", "0"):
        monkeypatch.setenv("EMBER_SHARED_MEMORY", shm)
        rng = np.random.default_rng(5)
        with running_servers(np.zeros(SIZE, F32), SGDRule(lr=0.1, momentum=0.9)) as (server,):
            client = _client(server, "int8")
            params = np.empty(SIZE, F32)
            client.pull(params)
            for _ in range(20):
                client.push(rng.normal(size=SIZE).astype(F32), reply_into=params, pull=True)
            assert client.connections[0].shared == (shm == "1")
            finals.append((params.copy(), server.params.copy()))
            client.close()
    np.testing.assert_array_equal(finals[0][0], finals[1][0])
    np.testing.assert_array_equal(finals[0][1], finals[1][1])


def test_a_non_finite_push_is_refused_and_the_exchanges_after_it_recover() -> None:
    """NaN in x_i (or a gradient) is refused as without compression, and neither the mirror
    nor the residual carries it on: the next finite exchange is folded again."""
    rng = np.random.default_rng(6)
    with running_servers(np.zeros(SIZE, F32), EASGDRule(alpha=0.5)) as (server,):
        client = _client(server, "int8", differences=True)
        x, elastic = rng.normal(size=SIZE).astype(F32), np.empty(SIZE, F32)
        for bad in (False, True, False, False):
            sent = x.copy()
            if bad:
                sent[5] = np.nan
            client.push(sent, reply_into=elastic)
            assert np.isfinite(elastic).all() and (elastic.any() != bad)
            x -= elastic
            if not bad:
                np.testing.assert_array_equal(client.links[0].mirror, _view(server, client))  # type: ignore[index]
        assert np.isfinite(server.params).all()
        assert control([server.address], SECRET, "stats")[0]["rejected"]["nonfinite"] >= 1
        client.close()
    with running_servers(np.zeros(SIZE, F32), SGDRule(lr=1.0)) as (server,):
        client = _client(server, "int8")
        g = np.ones(SIZE, F32)
        g[7] = np.inf
        client.push(g)
        client.push(np.ones(SIZE, F32))
        np.testing.assert_allclose(server.params, -1.0, rtol=0.01)
        assert np.isfinite(client.links[0].residual).all()  # type: ignore[index]
        client.close()
