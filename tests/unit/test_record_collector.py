"""Records streamed from Spark tasks to the driver: authenticated, bounded, never in the way."""

from __future__ import annotations

from typing import Any

import pytest

from ember.engines.process import free_port
from ember.engines.spark.records import RecordCollector, RecordSender
from ember.errors import ProtocolError
from ember.metrics.records import Note, Record
from ember.wire import ClientConnection
from tests.conftest import SECRET, transport
from tests.processes import wait_for

pytestmark = pytest.mark.timeout(60)


def note(index: int) -> dict[str, Any]:
    """A record as a task sends it: a line."""
    return Note(rank=0, text=str(index)).to_json()


def test_what_is_no_record_is_refused_and_the_records_after_it_arrive() -> None:
    with RecordCollector(SECRET) as collector:
        sender = ClientConnection(collector.address, SECRET, timeout=10.0)
        for line in ({"index": 1}, {"kind": "worker", "step": 3}, "text", note(7)):
            assert sender.notify({"op": "record", "record": line}, 1.0)
        arrived: list[Record] = []
        assert wait_for(lambda: len(arrived.extend(collector.drain()) or arrived) == 1, 10)
        assert arrived == [Note(rank=0, text="7")] and collector.refused == 3
        sender.close()


@pytest.mark.parametrize("encrypt", [True, False])
def test_the_collector_refuses_a_peer_without_the_runs_secret(encrypt: bool) -> None:
    with transport(encrypt), RecordCollector(SECRET) as collector:
        with pytest.raises(ProtocolError, match="refused the run's secret"):
            ClientConnection(collector.address, b"w" * 32, timeout=10.0)
        sender = RecordSender(collector.address, b"w" * 32)
        sender.send({"kind": "eval", "epoch": 1})
        sender.close()
        if encrypt:  # refused by CURVE: not one of their messages reaches the collector
            assert collector.rejected["unauthenticated"] == 0
        else:  # refused by the HMAC handshake behind the plain transport
            assert wait_for(lambda: collector.rejected["unauthenticated"] >= 2, 10)
        assert collector.drain() == []


def test_the_collector_bounds_records_per_connection_and_in_total() -> None:
    with RecordCollector(SECRET, per_connection=3, queued=4) as collector:
        first = ClientConnection(collector.address, SECRET, timeout=10.0)
        for index in range(10):
            assert first.notify({"op": "record", "record": note(index)}, 1.0)
        assert wait_for(lambda: collector.dropped == 7, 10), collector.dropped
        second = ClientConnection(collector.address, SECRET, timeout=10.0)
        for index in range(10, 20):
            assert second.notify({"op": "record", "record": note(index)}, 1.0)
        assert wait_for(lambda: collector.dropped == 16, 10), collector.dropped
        assert [r.text for r in collector.drain() if isinstance(r, Note)] == ["0", "1", "2", "10"]
        first.close()
        second.close()


def test_records_reach_the_collector_in_order_and_a_dead_one_fails_nothing() -> None:
    with RecordCollector(SECRET) as collector:
        sender = RecordSender(collector.address, SECRET)
        for step in range(5):
            sender.send(note(step))
        sender.close()
        arrived: list[Record] = []
        assert wait_for(lambda: len(arrived.extend(collector.drain()) or arrived) == 5, 10)
        assert [r.text for r in arrived if isinstance(r, Note)] == [str(s) for s in range(5)]
    nobody = RecordSender(f"tcp://127.0.0.1:{free_port()}", SECRET, queued=2)
    for step in range(10):
        nobody.send(note(step))  # never raises, never waits
    nobody.close(timeout=0.5)
    assert nobody.dropped >= 8
