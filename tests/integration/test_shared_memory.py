"""Same-host payloads through shared memory: the same results as the socket, no file left
behind, and a clean fall-back to the socket whenever a region cannot be used."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from ember.algorithms.rules import EASGDRule, SGDRule
from ember.errors import ProtocolError
from ember.ps import PSClient, control
from ember.wire import CHUNK_BYTES, gather, shared, tensors_from_frames
from tests.conftest import SECRET, running_servers

pytestmark = pytest.mark.timeout(60)

SIZE = 2 * CHUNK_BYTES // 4 + 777  # three chunks: the payload is cut as the socket cuts it


def _ember_files() -> set[str]:
    return {name for name in os.listdir(shared.SHM_DIR) if name.startswith("ember-")}


def _exchange(consistency: str, rule: object, monkeypatch: pytest.MonkeyPatch, share: bool):
    """One registered worker's push with pull (or easgd's reply); returns (reply, client
    shared?, server stats)."""
    monkeypatch.setenv(shared.DISABLE_VARIABLE, "1" if share else "0")
    params = np.linspace(-1, 1, SIZE, dtype=np.float32)
    grad = np.linspace(2, -2, SIZE, dtype=np.float32)
    with running_servers(params, rule, consistency, expected_workers=1) as (server,):
        client = PSClient([server.address], SECRET, worker=0, timeout=10)
        client.register()
        out = np.empty(SIZE, dtype=np.float32)
        for _ in range(2):  # the second round trip reuses the region
            client.push(grad, reply_into=out, pull=not rule.replies)  # type: ignore[attr-defined]
        stats = control([server.address], SECRET, "stats")[0]
        is_shared = client.connections[0].shared
        client.close()
    return out, is_shared, stats


@pytest.mark.parametrize(
    ("consistency", "rule"),
    [("async", SGDRule(lr=0.5)), ("bsp", SGDRule(lr=0.5)), ("async", EASGDRule(alpha=0.5))],
    ids=["streamed-sgd", "held-bsp", "streamed-easgd"],
)
def test_shared_memory_gives_what_the_socket_gives_and_leaves_no_file(
    consistency: str, rule: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _ember_files()
    through_memory, used_memory, stats = _exchange(consistency, rule, monkeypatch, share=True)
    through_socket, used_socket, socket_stats = _exchange(consistency, rule, monkeypatch, False)
    # two pushes, each answered with a reply, besides the register round trip
    assert used_memory and stats["shared_memory"] == {"peers": 1, "payloads": 2, "replies": 2}
    assert not used_socket
    assert socket_stats["shared_memory"] == {"peers": 0, "payloads": 0, "replies": 0}
    np.testing.assert_array_equal(through_memory, through_socket)
    params = np.linspace(-1, 1, SIZE, dtype=np.float32)
    grad = np.linspace(2, -2, SIZE, dtype=np.float32)
    expected = params - 2 * 0.5 * grad if isinstance(rule, SGDRule) else None
    if expected is not None:
        np.testing.assert_allclose(through_memory, expected, rtol=1e-5, atol=1e-5)
    assert _ember_files() == before  # each region was unlinked once both sides mapped it


@pytest.mark.parametrize("size", [True, "64", 0, 1 << 60], ids=["bool", "str", "zero", "huge"])
def test_a_region_the_server_cannot_make_is_refused_and_the_socket_carries_on(
    size: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(shared.DISABLE_VARIABLE, "0")  # the test asks for the region itself
    params = np.zeros(10, dtype=np.float32)
    with running_servers(params, SGDRule(lr=1.0)) as (server,):
        client = PSClient([server.address], SECRET, worker=0, timeout=5)
        client.register()
        connection = client.connections[0]
        connection.send({"op": "attach", "seq": 0, "bytes": size})
        answer, _ = connection.recv()
        assert answer["attached"] is False and "outside the limit" in answer["reason"]
        out = np.empty(10, dtype=np.float32)
        client.push(np.ones(10, np.float32), reply_into=out, pull=True)
        np.testing.assert_array_equal(out, -np.ones(10, np.float32))
        client.close()


def test_a_region_is_joined_only_when_it_is_a_sealed_memfd_of_the_named_size(
    tmp_path: Path,
) -> None:
    made = shared.Region.sealed(64)
    assert made is not None
    region, fd = made
    plain = os.open(tmp_path / "plain", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(plain, 128)
        assert shared.Region.join(region.path, 128).size == 128
        with pytest.raises(ProtocolError, match="does not hold 256 bytes"):
            shared.Region.join(region.path, 256)
        with pytest.raises(ProtocolError, match="not sealed against resizing"):
            shared.Region.join(f"/proc/{os.getpid()}/fd/{plain}", 128)
        with pytest.raises(ProtocolError, match="not a server's memfd"):
            shared.Region.join("/dev/shm/../etc/passwd", 128)
        peer = os.open(region.path, os.O_RDWR)
        try:
            with pytest.raises(OSError):  # the seals hold against the peer too
                os.ftruncate(peer, 0)
        finally:
            os.close(peer)
    finally:
        os.close(fd)
        os.close(plain)


def test_a_full_dev_shm_leaves_the_connection_on_the_socket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    before = _ember_files()
    params = np.zeros(10, dtype=np.float32)
    with running_servers(params, SGDRule(lr=1.0)) as (server,):
        client = PSClient([server.address], SECRET, worker=0, timeout=5)
        client.register()
        assert not client.connections[0].shared
        out = np.empty(10, dtype=np.float32)
        client.push(np.ones(10, np.float32), reply_into=out, pull=True)
        np.testing.assert_array_equal(out, -np.ones(10, np.float32))
        client.close()
    assert _ember_files() == before


def test_a_connection_whose_worker_reconnected_gets_a_clear_error_not_a_hang() -> None:
    params = np.zeros(10, dtype=np.float32)
    with running_servers(params, SGDRule(lr=1.0)) as (server,):
        old = PSClient([server.address], SECRET, worker=0, timeout=5)
        old.register()
        new = PSClient([server.address], SECRET, worker=0, incarnation=1, timeout=5)
        new.register()  # the server releases the old connection's region: one per worker
        with pytest.raises(ProtocolError, match="this connection has no region"):
            old.push(np.ones(10, np.float32))
        out = np.empty(10, dtype=np.float32)
        new.push(np.ones(10, np.float32), reply_into=out, pull=True)
        np.testing.assert_array_equal(out, -np.ones(10, np.float32))
        assert control([server.address], SECRET, "stats")[0]["shared_memory"]["peers"] == 1
        old.close()
        new.close()


def test_a_second_request_in_flight_is_answered_over_the_socket() -> None:
    params = np.linspace(-1, 1, SIZE, dtype=np.float32)
    with running_servers(params, SGDRule(lr=1.0)) as (server,):
        client = PSClient([server.address], SECRET, worker=0, timeout=5)
        client.register()
        connection = client.connections[0]
        for seq in (10, 11):  # both sent before either reply is read: one region, two replies
            connection.send(
                {"op": "pull", "worker": 0, "incarnation": 0, "seq": seq, "clock": 0, "step": 0}
            )
        routes = []
        for _ in range(2):
            header, frames = connection.recv()
            out = np.empty(SIZE, dtype=np.float32)
            gather(tensors_from_frames(header["tensors"], frames, 4 * SIZE)[0], out)
            np.testing.assert_array_equal(out, params)
            routes.append(bool(header.get("shm")))
        assert routes == [True, False]
        client.close()


def test_payloads_written_and_read_in_place_give_what_copies_give(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """EASGD through a client's shared buffers: the push is written straight into the region
    and the elastic difference read where the server computed it, round after round."""
    monkeypatch.setenv(shared.DISABLE_VARIABLE, "1")
    params = np.linspace(-1, 1, SIZE, dtype=np.float32)
    start = np.linspace(3, -3, SIZE, dtype=np.float32)
    alpha, rounds = 0.25, 3
    results = {}
    for in_place in (True, False):
        with running_servers(params, EASGDRule(alpha=alpha), "async", expected_workers=1) as (
            server,
        ):
            client = PSClient([server.address], SECRET, worker=0, timeout=10)
            client.register()
            buffers = client.shared_buffers()
            assert buffers is not None
            if not in_place:
                buffers = (np.empty(SIZE, np.float32), np.empty(SIZE, np.float32))
            request, reply = buffers
            x = start.copy()
            for _ in range(rounds):  # x_i -= e each round, as a worker does
                request[...] = x
                client.push(request, reply_into=reply)
                x -= reply
            results[in_place] = x
            stats = control([server.address], SECRET, "stats")[0]
            client.close()
        assert stats["shared_memory"]["replies"] == rounds
    np.testing.assert_array_equal(results[True], results[False])
    center, x = params.copy(), start.copy()  # the paper's update, by hand
    for _ in range(rounds):
        elastic = alpha * (x - center)
        center += elastic
        x -= elastic
    np.testing.assert_allclose(results[True], x, rtol=1e-5, atol=1e-6)


def test_several_shards_have_no_shared_buffers() -> None:
    params = np.zeros(SIZE, dtype=np.float32)
    with running_servers(params, EASGDRule(alpha=0.5), "async", shards=2) as servers:
        client = PSClient([s.address for s in servers], SECRET, worker=0, timeout=10)
        client.register()
        assert all(c.shared for c in client.connections)
        assert client.shared_buffers() is None
        client.close()
