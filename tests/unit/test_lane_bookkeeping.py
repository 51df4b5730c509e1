"""Lanes in isolation: who may join a connection's lanes, how a striped request's chunks are
put back in order whatever order the lanes deliver them in, what a lane may send ahead of its
header, what a lane that closes takes with it, and how a probe's rates choose a count."""

from __future__ import annotations

from typing import Any

import pytest

from ember.errors import ProtocolError
from ember.wire import lanes, striping
from ember.wire.lanes import ServerLanes
from ember.wire.request import Request

CONNECTION, LANE_1, LANE_2, STRANGER = b"conn", b"lane-1", b"lane-2", b"stranger"


def _as_is(peer: bytes, frame: Any, request: Request, index: int) -> Any:
    return frame


def _joined(count: int = 3) -> ServerLanes:
    server = ServerLanes()
    token = server.register(CONNECTION, {"op": "lanes"})["token"]
    for index, lane in enumerate((LANE_1, LANE_2)[: count - 1], start=1):
        assert server.register(lane, {"op": "lane", "token": token, "index": index}) == {}
    return server


def _request(chunks: int, size: int = 4) -> Request:
    return Request(CONNECTION, {"op": "push"}, [], [size] * chunks)


def _frame(index: int, size: int = 4) -> bytes:
    return bytes([index]) * size


def test_only_a_lane_holding_the_connections_token_joins_at_a_free_index() -> None:
    server = ServerLanes()
    token = server.register(CONNECTION, {"op": "lanes"})["token"]
    assert server.register(CONNECTION, {"op": "lanes"})["token"] == token  # asked again
    refused = [
        (STRANGER, {"op": "lane", "token": "0" * 32, "index": 1}),
        (STRANGER, {"op": "lane", "token": token, "index": 0}),
        (STRANGER, {"op": "lane", "token": token, "index": lanes.MAX_LANES}),
        (STRANGER, {"op": "lane", "token": token, "index": True}),
        (CONNECTION, {"op": "lane", "token": token, "index": 1}),  # itself
    ]
    for peer, header in refused:
        assert server.register(peer, header)["op"] == "error", header
    assert server.register(LANE_1, {"op": "lane", "token": token, "index": 1}) == {}
    assert server.register(LANE_2, {"op": "lane", "token": token, "index": 1})["op"] == "error"
    assert server.register(LANE_1, {"op": "lanes"})["op"] == "error"  # a lane asks nothing


@pytest.mark.parametrize("count", [3, 4, 1, 9, True, "2"])
def test_a_request_may_name_only_lanes_its_connection_opened(count: object) -> None:
    with pytest.raises(ProtocolError, match="lanes this connection has not opened"):
        _joined(2).stripe(_request(4), count)


@pytest.mark.parametrize("order", ["lane by lane", "backwards", "interleaved"])
def test_chunks_are_handed_on_in_order_whatever_order_the_lanes_deliver(order: str) -> None:
    server, request = _joined(3), _request(7)
    server.stripe(request, 3)
    by_lane = {peer: list(range(lane, 7, 3)) for lane, peer in enumerate(request.lanes)}
    arrivals = [(peer, index) for peer, indices in by_lane.items() for index in indices]
    if order == "backwards":  # lane 2 first, then lane 1, then the connection itself
        arrivals = [(peer, index) for peer in reversed(request.lanes) for index in by_lane[peer]]
    elif order == "interleaved":
        arrivals.sort(key=lambda item: (by_lane[item[0]].index(item[1]), -item[1]))
    finished = [server.take(peer, _frame(index), _as_is) for peer, index in arrivals]
    assert finished[:-1] == [None] * 6 and finished[-1] is request
    assert [frame for _, frame in server.ready] == [_frame(i) for i in range(7)]
    assert server.usage() == {"striped_requests": 1, "most_lanes": 3}


def test_frames_a_lane_sends_ahead_of_their_header_wait_for_it_within_a_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, request = _joined(2), _request(4)
    assert server.take(LANE_1, _frame(1), _as_is) is None  # before the header came
    assert server.take(LANE_1, _frame(3), _as_is) is None
    assert server.stats()["early_frames"] == 2
    server.stripe(request, 2)
    assert server.flush(request, _as_is) is None
    assert server.stats()["early_frames"] == 0
    assert server.take(CONNECTION, _frame(0), _as_is) is None
    assert server.take(CONNECTION, _frame(2), _as_is) is request
    assert [frame for _, frame in server.ready] == [_frame(i) for i in range(4)]
    # Every frame is charged beyond its bytes, so frames of none are bounded too.
    monkeypatch.setattr(lanes, "EARLY_BYTES", 2 * lanes.EARLY_FRAME_COST)
    server.take(LANE_1, b"", _as_is)
    server.take(LANE_1, b"", _as_is)
    with pytest.raises(ProtocolError, match="lane ran 0 MiB ahead"):
        server.take(LANE_1, b"", _as_is)


def test_a_chunk_of_another_size_than_declared_is_refused() -> None:
    server, request = _joined(2), _request(2)
    server.stripe(request, 2)
    with pytest.raises(ProtocolError, match="payload frame 1 has 3 bytes, header declares 4"):
        server.take(LANE_1, b"abc", _as_is)


def test_a_lane_closing_between_requests_goes_alone_and_mid_request_ends_every_lane() -> None:
    server = _joined(3)
    assert server.closed(LANE_2) == ([], [])
    with pytest.raises(ProtocolError):  # lane 2 is gone: a request cannot name it
        server.stripe(_request(2), 3)
    request = _request(4)
    server.stripe(request, 2)
    server.take(CONNECTION, _frame(0), _as_is)
    broken, others = server.closed(LANE_1)
    assert [r is request for r in broken] == [True] and others == [CONNECTION]
    assert not server.ready and server.stats() == {"lanes": 0, "early_frames": 0}
    assert not server.carries(CONNECTION)


def test_a_lane_that_fails_between_requests_ends_the_connection_and_every_lane() -> None:
    server = _joined(3)
    assert server.closed(LANE_1, failed=True) == ([], [CONNECTION, LANE_2])
    assert server.stats()["lanes"] == 0 and not server.carries(LANE_2)


def test_a_dropped_request_still_takes_its_chunks_and_hands_none_on() -> None:
    server, request = _joined(2), _request(4)
    server.stripe(request, 2)
    server.take(CONNECTION, _frame(0), _as_is)
    server.drop(CONNECTION)
    assert request.dropped and not server.ready
    finished = [server.take(p, _frame(i), _as_is) for p, i in ((LANE_1, 1), (LANE_1, 3))]
    assert finished == [None, None]
    assert server.take(CONNECTION, _frame(2), _as_is) is request
    assert not server.ready and not server.carries(CONNECTION)


class _Timed:
    """A connection whose probe rates are given, by lane count."""

    shared = False  # on the socket: a connection sharing memory is not probed

    def __init__(self, rates: dict[int, float]) -> None:
        self.rates, self.lane_count, self.counts = rates, 1, [1]

    def set_lanes(self, count: int) -> None:
        self.lane_count = count
        self.counts.append(count)


@pytest.mark.parametrize(
    ("rates", "chosen"),
    [
        ({1: 10.0, 2: 11.0, 4: 11.4}, 1),  # a tenth more is noise, not worth a socket
        ({1: 10.0, 2: 12.0, 4: 12.2}, 1),  # a fifth more is still noise on a busy host
        ({1: 10.0, 2: 13.0, 4: 13.5}, 2),
        ({1: 10.0, 2: 13.0, 4: 17.0}, 4),  # at least PROBE_GAIN over the count chosen so far
        ({1: 10.0, 2: 9.0, 4: 30.0}, 4),
    ],
)
def test_a_probe_takes_more_lanes_only_for_its_gain_over_the_count_kept(
    rates: dict[int, float], chosen: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    connection = _Timed(rates)
    monkeypatch.setattr(striping, "_rate", lambda c, payload: c.rates[c.lane_count])
    choice = striping.probe(connection, 4)  # type: ignore[arg-type]
    assert choice.lanes == chosen and connection.lane_count == chosen
    assert choice.rates == rates and connection.counts[1:4] == [1, 2, 4]
    assert f"{chosen} lane(s)" in choice.describe()


def test_the_lane_setting_is_auto_or_a_count() -> None:
    for good in ("auto", "1", "8"):
        assert striping.lane_setting(good) == good
    for bad in ("0", "9", "two", ""):
        with pytest.raises(ValueError, match="wire lanes must be"):
            striping.lane_setting(bad)
