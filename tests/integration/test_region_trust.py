"""A server maps only regions it made and sealed: a client cannot truncate one under the
server's mapping (no SIGBUS on the read or the write path), and a file a client names,
hard-linked into /dev/shm or not, is never read or written. A region is its worker's alone
and no larger than a push, and what a worker writes into it during its push reaches the fold
once, as read."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from ember.algorithms.rules import EASGDRule, SGDRule
from ember.ps import PSClient, control, fetch_state
from ember.ps.fold import Fold
from ember.wire import CHUNK_BYTES, ClientConnection, shared
from tests.conftest import SECRET, running_servers

pytestmark = pytest.mark.timeout(60)

SIZE = CHUNK_BYTES // 4 + 99  # two chunks


@pytest.mark.parametrize(
    "rule", [SGDRule(lr=0.5), EASGDRule(alpha=0.5)], ids=["sgd-pull", "easgd-reply"]
)
def test_a_client_cannot_resize_its_region_and_the_server_reads_and_writes_it(
    rule: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(shared.DISABLE_VARIABLE, "1")
    refused: list[str] = []
    join = shared.Region.join

    def join_then_resize(path: object, size: object) -> shared.Region:
        # Before the client's next message the server's fd is still open: the one moment a
        # client can reach the memfd by path. Try to shrink it to nothing, and to grow it.
        fd = os.open(str(path), os.O_RDWR)
        try:
            for length in (0, 1, 2 * int(size)):  # type: ignore[call-overload]
                try:
                    os.ftruncate(fd, length)
                except PermissionError:
                    refused.append(f"ftruncate {length}")
        finally:
            os.close(fd)
        return join(path, size)

    monkeypatch.setattr(shared.Region, "join", staticmethod(join_then_resize))
    params = np.linspace(-1, 1, SIZE, dtype=np.float32)
    grad = np.ones(SIZE, dtype=np.float32)
    with running_servers(params, rule) as (server,):  # type: ignore[arg-type]
        client = PSClient([server.address], SECRET, worker=0, timeout=10)
        client.register()
        assert client.connections[0].shared and len(refused) == 3, refused
        out = np.empty(SIZE, dtype=np.float32)
        for _ in range(2):  # the server reads each payload from the region, writes each reply
            client.push(grad, reply_into=out, pull=isinstance(rule, SGDRule))
        stats = control([server.address], SECRET, "stats")[0]
        client.close()
    assert stats["shared_memory"]["payloads"] == 2 and stats["shared_memory"]["replies"] == 2
    if isinstance(rule, SGDRule):
        np.testing.assert_allclose(out, params - 2 * 0.5 * grad, rtol=1e-6, atol=1e-6)


def test_a_hard_linked_file_a_client_names_is_never_read_or_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(shared.DISABLE_VARIABLE, "0")  # the test attaches by hand
    victim = os.path.join(shared.SHM_DIR, f"victim-{os.urandom(8).hex()}")
    link = os.path.join(shared.SHM_DIR, f"ember-{os.urandom(16).hex()}")
    content = np.arange(2 * SIZE, dtype=np.float32)
    content.tofile(victim)
    os.link(victim, link)  # a same-user file under the name of a region
    params = np.zeros(SIZE, dtype=np.float32)
    try:
        with running_servers(params, SGDRule(lr=1.0)) as (server,):
            client = PSClient([server.address], SECRET, worker=0, timeout=10)
            client.register()
            connection = client.connections[0]
            connection.send(
                {"op": "attach", "seq": 0, "region": os.path.basename(link), "bytes": 8 * SIZE}
            )
            answer, _ = connection.recv()
            # The server answers with a region of its own; the name is not looked at.
            assert answer["attached"] and answer["path"].startswith(f"/proc/{os.getpid()}/fd/")
            connection._region = shared.Region.join(answer["path"], answer["bytes"])
            out = np.empty(SIZE, dtype=np.float32)
            client.push(np.ones(SIZE, np.float32), reply_into=out, pull=True)
            np.testing.assert_array_equal(out, -np.ones(SIZE, np.float32))
            assert control([server.address], SECRET, "stats")[0]["shared_memory"]["payloads"] == 1
            connection.send({"op": "attach", "seq": 0, "bytes": 8 * SIZE})
            again, _ = connection.recv()  # one region per connection, never swapped
            assert again["attached"] is False and "already has a region" in again["reason"]
            client.close()
        np.testing.assert_array_equal(np.fromfile(victim, dtype=np.float32), content)
        assert os.stat(victim).st_nlink == 2  # nobody opened, unlinked or replaced it
    finally:
        os.unlink(link)
        os.unlink(victim)


def test_a_connection_cannot_take_another_workers_region_nor_reserve_more_than_a_push(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(shared.DISABLE_VARIABLE, "1")
    params = np.zeros(SIZE, dtype=np.float32)
    with running_servers(params, SGDRule(lr=1.0)) as (server,):
        victim = PSClient([server.address], SECRET, worker=0, timeout=10)
        victim.register()
        assert victim.connections[0].shared
        thief = ClientConnection(server.address, SECRET, timeout=10)
        thief.send({"op": "attach", "seq": 0, "bytes": 8 * SIZE, "owner": 0})
        answer = thief.recv()[0]
        assert answer["attached"] is False
        assert answer["reason"] == "worker 0 is held by another connection"
        for size in (2 << 34, 4 * (256 << 20)):  # 2 x 16 GiB, or 1 GiB, for a 4 MiB push
            thief.send({"op": "attach", "seq": 0, "bytes": size})
            answer = thief.recv()[0]
            assert answer["attached"] is False and "outside the limit" in answer["reason"]
        for _ in range(2):  # the victim's pushes go on through its region
            victim.push(np.ones(SIZE, np.float32))
        stats = control([server.address], SECRET, "stats")[0]
        state, _ = fetch_state([server.address], SECRET)
        thief.close()
        victim.close()
    assert stats["shared_memory"]["payloads"] == 2
    np.testing.assert_array_equal(state["params"], -2 * np.ones(SIZE, np.float32))


def test_a_worker_writing_its_region_during_its_push_costs_only_its_own_push(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under bsp, NaN written into a worker's region between the server's finite check and
    its add must not reach the round's sum: the fold reads the payload once."""
    monkeypatch.setenv(shared.DISABLE_VARIABLE, "1")
    params = np.zeros(SIZE, dtype=np.float32)
    with running_servers(params, SGDRule(lr=1.0), "bsp", expected_workers=2) as (server,):
        clients = [PSClient([server.address], SECRET, worker=w, timeout=10) for w in (0, 1)]
        for client in clients:
            client.register()
        region = clients[0].connections[0]._region
        assert region is not None
        request_half = region.half_view(False, SIZE)
        checked = Fold._finite
        poisoned: list[bool] = []

        def check_then_poison(fold: Fold, chunk: np.ndarray, out: np.ndarray | None) -> bool:
            verdict = checked(fold, chunk, out)
            if not poisoned:  # the first chunk checked is worker 0's: now it writes NaN there
                request_half[: chunk.size] = np.nan
                poisoned.append(True)
            return verdict

        monkeypatch.setattr(Fold, "_finite", check_then_poison)
        first = threading.Thread(target=clients[0].push, args=(np.ones(SIZE, np.float32),))
        first.start()
        deadline = time.monotonic() + 10
        while server.counters["pushes"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        clients[1].push(np.ones(SIZE, np.float32))
        first.join(10)
        state, _ = fetch_state([server.address], SECRET)
        stats = control([server.address], SECRET, "stats")[0]
        for client in clients:
            client.close()
    assert poisoned and stats["rejected"].get("nonfinite", 0) == 0
    np.testing.assert_array_equal(state["params"], -np.ones(SIZE, np.float32))  # the round's mean
