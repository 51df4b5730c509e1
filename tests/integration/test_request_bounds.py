"""Bounds a server holds a credentialed client to: registrations past --max-workers are one
clear error, and a push or pull whose step is negative is refused before it is applied."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ember.algorithms.rules import SGDRule
from ember.config import RunConfig
from ember.engines.servers import ServerGroup
from ember.errors import ProtocolError
from ember.ps import PSClient, control, fetch_state
from tests.conftest import SECRET, running_servers

pytestmark = pytest.mark.timeout(120)


def test_a_server_started_with_max_workers_refuses_the_registration_past_it(
    tmp_path: Path,
) -> None:
    config = RunConfig(strategy="async", workers=2, max_workers=3).validate()
    group = ServerGroup(config, np.zeros(100, dtype=np.float32), SECRET, tmp_path)
    clients: list[PSClient] = []
    try:
        (address,) = group.start()
        for worker in (0, 1, 2):  # the run's two, and one joiner: the table is full
            clients.append(PSClient([address], SECRET, worker=worker, timeout=10))
            clients[-1].register()
        extra = PSClient([address], SECRET, worker=3, timeout=10)
        clients.append(extra)
        with pytest.raises(ProtocolError, match=r"worker 3 cannot register: .*max_workers=3"):
            extra.register()
        stats = control([address], SECRET, "stats")[0]
    finally:
        for client in clients:
            client.close()
        group.stop()
    assert stats["workers"]["max_workers"] == 3
    assert stats["workers"]["table"] == 3
    assert stats["rejected"] == {"register": 1, "request": 1}


@pytest.mark.parametrize("op", ["push", "pull"])
def test_a_negative_step_is_refused_counted_and_never_applied(op: str) -> None:
    params = np.zeros(100, dtype=np.float32)
    with running_servers(params, SGDRule(lr=1.0)) as (server,):
        client = PSClient([server.address], SECRET, worker=0, timeout=10)
        client.register()
        client.step = -1  # what the client sends as its resume point
        with pytest.raises(ProtocolError, match="'step' must be >= 0, got -1"):
            if op == "push":
                client.push(np.ones(100, dtype=np.float32))
            else:
                client.pull(np.empty(100, dtype=np.float32))
        client.step = 5
        client.push(np.ones(100, dtype=np.float32))  # the connection serves on
        state, meta = fetch_state([server.address], SECRET)
        stats = control([server.address], SECRET, "stats")[0]
        client.close()
    np.testing.assert_array_equal(state["params"], -np.ones(100, dtype=np.float32))  # one push
    assert meta["workers"]["0"]["step"] == 5
    assert stats["rejected"] == {"step": 1, "request": 1}
