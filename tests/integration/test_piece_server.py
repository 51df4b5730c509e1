"""The data cursor on a real ParameterServer (the `piece` op): members below the range's MIN
wait for others up to the worker timeout, a restarted member's dead incarnation hands its
pieces on, and a request that cuts other data is refused and counted."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from ember.algorithms.rules import SGDRule
from ember.errors import ProtocolError
from ember.ps import PSClient, ShardSpec, control, make_consistency
from ember.ps.piece_protocol import Dealt, Take
from ember.ps.pieces import Geometry
from ember.ps.server import ParameterServer
from ember.wire import ClientConnection
from tests.conftest import SECRET, running_servers

pytestmark = pytest.mark.timeout(60)

CUT = Geometry(rows=40, piece_rows=10, epochs=1)


def ask(connection: ClientConnection, worker: int, seq: int, **fields: object) -> Dealt:
    take = Take(worker=worker, incarnation=fields.pop("incarnation", 0), seq=seq, epoch=0,  # type: ignore[arg-type]
                geometry=fields.pop("geometry", CUT), **fields)  # type: ignore[arg-type]  # fmt: skip
    connection.send(take.header())
    return Dealt.from_header(connection.recv()[0])


def register(address: str, worker: int, incarnation: int = 0) -> PSClient:
    client = PSClient([address], SECRET, worker=worker, incarnation=incarnation, timeout=5)
    client.register()
    return client


def test_below_min_a_member_waits_for_others_then_goes_on_with_whoever_is_in() -> None:
    params = np.zeros(8, np.float32)
    with running_servers(params, SGDRule(lr=0.1), expected_workers=2, worker_timeout=1.0) as (
        server,
    ):
        first = register(server.address, 0)
        pieces = ClientConnection(server.address, SECRET, timeout=5)
        assert ask(pieces, 0, 1, take=True).wait  # 1 member of MIN 2: it waits
        second = register(server.address, 1)
        dealt = ask(pieces, 0, 2, take=True)
        assert dealt.piece == (0, 0)  # both in: rows are dealt
        # member 1 falls silent and is dropped: member 0, waiting, is not (it asks), and it
        # waits for another up to the worker timeout, then goes on: a range never fails
        dropped = lambda: any(  # noqa: E731
            e["event"] == "drop" and e["worker"] == 1
            for e in control([server.address], SECRET, "stats")[0]["events"]
        )
        seq = 3
        while not dropped():  # member 0 keeps asking meanwhile, as a waiting member does
            ask(pieces, 0, seq, take=False)
            seq += 1
            time.sleep(0.1)
        waited, waits = time.monotonic(), 0
        while (reply := ask(pieces, 0, seq, take=True)).wait:
            waits += 1
            assert time.monotonic() - waited < 10, "still waiting past the worker timeout"
            seq += 1
            time.sleep(0.05)
        assert waits > 0 and reply.piece == (0, 1)
        assert 0.5 < time.monotonic() - waited < 10
        events = control([server.address], SECRET, "stats")[0]["events"]
        assert [e["worker"] for e in events if e["event"] == "drop"] == [1]  # not member 0
        # one that leaves cleanly (asked to, or out of rows) makes nobody wait
        back = register(server.address, 1, incarnation=1)
        back.done()
        assert ask(pieces, 0, seq + 1, take=True).piece is not None
        first.close(), second.close(), back.close(), pieces.close()


def test_a_restarted_members_dead_incarnation_hands_its_served_piece_on() -> None:
    params = np.zeros(8, np.float32)
    with running_servers(params, SGDRule(lr=0.1), expected_workers=1) as (server,):
        dead = register(server.address, 0)
        pieces = ClientConnection(server.address, SECRET, timeout=5)
        assert ask(pieces, 0, 1, take=True).piece == (0, 0)
        ask(pieces, 0, 2, take=True, started=(0, 0))  # served, and (0, 1) dealt ahead
        restarted = register(server.address, 0, incarnation=1)
        again = [ask(pieces, 0, 3 + i, take=True, incarnation=1).piece for i in range(2)]
        assert again == [(0, 1), (0, 0)]  # given back to the front, the served one counted
        stats = control([server.address], SECRET, "stats")[0]["pieces"]
        assert stats["rows_trained_twice"] == 10 and stats["reissued"] == 1
        dead.close(), restarted.close(), pieces.close()


def test_a_member_that_cuts_other_data_is_refused_and_counted() -> None:
    params = np.zeros(8, np.float32)
    with running_servers(params, SGDRule(lr=0.1), expected_workers=1) as (server,):
        client = register(server.address, 0)
        pieces = ClientConnection(server.address, SECRET, timeout=5)
        assert ask(pieces, 0, 1, take=True).piece == (0, 0)
        other = Geometry(rows=50, piece_rows=10, epochs=1)
        with pytest.raises(ProtocolError, match="cuts the data as 50 rows"):
            ask(pieces, 0, 2, take=True, geometry=other)
        with pytest.raises(ProtocolError, match="epoch"):
            pieces.send({**Take(worker=0, incarnation=0, seq=3, epoch=0, geometry=CUT).header(),
                         "epoch": -1})  # fmt: skip
            pieces.recv()
        rejected = control([server.address], SECRET, "stats")[0]["rejected"]
        assert rejected["cut"] == 1 and rejected["epoch"] == 1
        client.close(), pieces.close()


def test_a_promoted_backup_deals_on_from_its_primarys_cursor() -> None:
    """The cursor travels with each copy to the backup: after a failover the new primary
    deals what the old one had not, and a piece finished across the failover once."""
    params = np.zeros(8, np.float32)
    spec, rule = ShardSpec(0, 1, 0, params.size), SGDRule(lr=0.1)
    policy = make_consistency("async", 0)
    backup = ParameterServer(spec, params, rule, policy, SECRET, role="backup")
    primary = ParameterServer(
        spec, params, rule, policy, SECRET, backup=backup.address, replica_seconds=0.05
    )
    threads = [threading.Thread(target=s.serve, daemon=True) for s in (backup, primary)]
    for thread in threads:
        thread.start()
    try:
        client = register(primary.address, 0)
        pieces = ClientConnection(primary.address, SECRET, timeout=5)
        first = ask(pieces, 0, 1, take=True).piece
        second = ask(pieces, 0, 2, take=True, started=first, finished=first).piece
        assert (first, second) == ((0, 0), (0, 1))
        ask(pieces, 0, 3, take=False, started=second)  # (0, 1) served, not yet finished
        time.sleep(0.5)  # a few copies
        control([primary.address], SECRET, "stop")
        threads[1].join(5)
        control([backup.address], SECRET, "promote")
        register(backup.address, 0).close()
        moved = ClientConnection(backup.address, SECRET, timeout=5)
        ask(moved, 0, 4, take=False, finished=second)  # finished against the new primary
        dealt = [ask(moved, 0, 5 + i, take=True).piece for i in range(3)]
        assert dealt == [(0, 2), (0, 3), None]  # (0, 0) and (0, 1) are not dealt again
        stats = control([backup.address], SECRET, "stats")[0]["pieces"]
        assert stats["epoch_rows"] == [20] and stats["rows_trained_twice"] == 0
        client.close(), pieces.close(), moved.close()
    finally:
        for server in (backup, primary):
            if server.address and threads[(backup, primary).index(server)].is_alive():
                control([server.address], SECRET, "stop", timeout=5)
