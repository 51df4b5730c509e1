"""A client that sends requests and never reads the replies holds a bounded part of a server:
past a few shard copies of unread replies its requests are refused (`rejected.slow_reader`),
while an honest worker, which reads each reply before its next request, trains on."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from ember.config import RunConfig
from ember.engines.servers import ServerGroup
from ember.errors import ProtocolError
from ember.ps import control
from ember.wire import shared
from tests.conftest import SECRET
from tests.rogue_peers import unread_pulls

pytestmark = pytest.mark.timeout(180)

MiB = 1 << 20
KEYS = 1 << 20  # one shard of 4 MiB: each reply a slow reader holds may be a copy of it
SHARD_BYTES = 4 * KEYS
REQUESTS = 60  # on unbounded queues, 60 unread pulls made a server hold 57 private copies
# What a server may grow by: what an honest exchange allocates, and replies a slow reader left
# unread up to its budget (a snapshot's worth with momentum and one more copy, 3 copies),
# plus two more copies in flight (the reply that crossed the budget, an update's copy).
BOUND = 64 * MiB + 5 * SHARD_BYTES


@contextmanager
def server_process(tmp_path: Path, config: RunConfig) -> Iterator[tuple[int, str]]:
    """(pid, address) of one real parameter-server process of `config`'s run."""
    group = ServerGroup(config, np.zeros(KEYS, dtype=np.float32), SECRET, tmp_path)
    try:
        (address,) = group.start()
        yield group.processes[0].pid, address
    finally:
        group.stop()


def test_a_client_that_never_reads_replies_cannot_make_a_server_queue_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(shared.DISABLE_VARIABLE, "0")  # replies over the socket, where they queue
    config = RunConfig(strategy="async", workers=2).validate()
    pulled = np.empty(KEYS, dtype=np.float32)
    with server_process(tmp_path, config) as (pid, address):
        growth, honest, slow = unread_pulls(address, pid, SECRET, KEYS, REQUESTS)
        reader = slow.connections[0]
        assert growth < BOUND, f"server grew {growth / MiB:.0f} MiB, bound {BOUND / MiB:.0f} MiB"
        stats = control([address], SECRET, "stats")[0]
        # the honest worker trains on
        honest.push(np.full(KEYS, 1e-3, np.float32), reply_into=pulled, pull=True)
        trained = honest.pull(pulled)
        # What the slow reader finds when it reads at last: a few answers, then the refusal.
        answered = 0
        with pytest.raises(ProtocolError, match=r"slow reader: \d+ MiB of this connection's"):
            for _ in range(REQUESTS):
                reader.recv()
                answered += 1
        slow.close()
        honest.close()
    assert stats["rejected"].get("slow_reader", 0) >= REQUESTS - answered - 1
    assert 1 <= answered < REQUESTS // 2
    assert trained.bytes_pulled == SHARD_BYTES
    assert pulled[0] < 0  # every honest push of +1e-3 gradients was applied
