"""What a server counts of the replies a peer has not taken, and the reply buffers it keeps."""

from __future__ import annotations

from typing import Any

import numpy as np
import zmq

from ember.algorithms.rules import SGDRule
from ember.ps.clocks import ClockTable
from ember.ps.replies import POOL_BUFFERS, Replies
from ember.ps.shard import Shard, ShardSpec
from ember.wire import SendTicket
from ember.wire.sockets import ReplyBacklog
from ember.wire.ticket import COPIED


class Tracker:
    """Stands in for a zmq.MessageTracker: `done` once zmq let go of the message; `lags`:
    zmq has, and pyzmq marks it done once waited for (its garbage collector caught up)."""

    def __init__(self, lags: bool = False) -> None:
        self.done, self.lags, self.waits = False, lags, 0

    def wait(self, timeout: float) -> None:
        assert 0 <= timeout <= 1
        self.waits += 1
        if self.lags:
            self.done = True
        if not self.done:
            raise zmq.NotDone


def test_unread_bytes_count_until_zmq_lets_go_and_a_peer_over_budget_is_flagged() -> None:
    backlog = ReplyBacklog(budget=100)
    first, second = Tracker(), Tracker()
    sent: Any = backlog.sent  # the trackers are stand-ins
    sent(b"slow", 60, first)
    sent(b"slow", 60, second)
    sent(b"other", 10, Tracker())
    assert backlog.unread(b"slow") == 120
    assert backlog.over_budget(b"slow")
    assert not backlog.over_budget(b"other")
    first.done = True
    assert backlog.unread(b"slow") == 60
    assert not backlog.over_budget(b"slow")
    second.done = True
    assert backlog.peers() == 1  # a peer whose replies all left is not kept
    backlog.forget(b"other")
    assert backlog.peers() == 0
    assert backlog.unread(b"never") == 0


def test_an_honest_peer_with_one_reply_out_is_never_over_budget() -> None:
    backlog = ReplyBacklog(budget=100)
    sent: Any = backlog.sent
    for _ in range(1000):  # each reply is still counted when the next request arrives
        tracker = Tracker()
        sent(b"honest", 100, tracker)
        assert not backlog.over_budget(b"honest")
        tracker.done = True


def test_an_honest_peer_whose_trackers_lag_is_not_called_a_slow_reader() -> None:
    backlog = ReplyBacklog(budget=100)
    sent: Any = backlog.sent
    lagging = [Tracker(lags=True) for _ in range(3)]
    for tracker in lagging:  # replies zmq let go of, not yet marked done
        sent(b"honest", 60, tracker)
    sent(b"honest", 60, Tracker())  # the reply it is reading now
    assert not backlog.over_budget(b"honest")
    assert backlog.unread(b"honest") == 60
    assert [t.waits for t in lagging] == [1, 1, 1]


def test_a_slow_reader_costs_one_wait_per_oldest_reply_not_one_per_request() -> None:
    backlog = ReplyBacklog(budget=100)
    sent: Any = backlog.sent
    first = Tracker()
    sent(b"slow", 60, first)
    sent(b"slow", 60, Tracker())
    for _ in range(50):  # requests it sends and never reads the replies of
        assert backlog.over_budget(b"slow")
    assert first.waits == 1
    first.done = True  # it read one at last: its next oldest reply gets a wait of its own
    sent(b"slow", 60, Tracker())
    assert backlog.over_budget(b"slow") and backlog.over_budget(b"slow")
    assert first.waits == 1


def test_the_reply_pool_keeps_a_few_buffers_whatever_a_burst_allocated() -> None:
    clocks = ClockTable(1, None, 30.0, 30.0)
    rule = SGDRule(lr=0.1)
    shard = Shard(ShardSpec(0, 1, 0, 16), np.zeros(16, np.float32), rule, clocks, synchronous=False)
    replies = Replies(shard)
    tracker: Any = Tracker()
    pending = SendTicket(tracker)
    buffers = [replies.buffer() for _ in range(10)]  # a burst of replies none of which left
    assert len({b.ctypes.data for b in buffers}) == 10
    for buffer in buffers:
        replies.recycle(buffer, pending)
    assert len(replies._pool) == POOL_BUFFERS
    fresh = replies.buffer()  # every pooled buffer is still read: a new one
    assert all(fresh is not kept for kept, _ in replies._pool)
    replies.recycle(fresh, COPIED)
    assert replies.buffer() is fresh  # a buffer zmq is done with is reused
