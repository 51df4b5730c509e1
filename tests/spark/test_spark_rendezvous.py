"""allreduce's meeting on Spark, piece by piece: the probe of rank 0, the state rank 0 hands
back, and the warning gloo's plain traffic earns on a cluster."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from ember.checkpoint import save_checkpoint
from ember.config import RunConfig
from ember.engines.spark.rendezvous import (
    Meeting,
    connect,
    exposure,
    final_state,
    meet,
    reach,
    state_params,
)
from ember.metrics.records import FinalState


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # nothing listens once it closes


def test_a_rank_that_cannot_reach_rank_0_says_from_where_and_what_it_tried() -> None:
    port = closed_port()
    line = reach(Meeting("127.0.0.1", port), rank=1, seconds=2.0)
    assert line == (
        f"the training task on {socket.gethostname()} (127.0.0.1) cannot reach allreduce's"
        f" rank 0 (its gloo rendezvous) at 127.0.0.1 port {port}: Connection refused. Check"
        " that no firewall between the executors drops the port, and --ports"
    )
    assert reach(Meeting("127.0.0.1", port), rank=0) is None  # rank 0 is the one listening
    failed = Meeting("127.0.0.1", 0, error="rank 0 could not listen")
    assert reach(failed, rank=1) == reach(failed, rank=0) == "rank 0 could not listen"


def test_a_listening_rank_0_is_reached() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        assert reach(Meeting("127.0.0.1", server.getsockname()[1]), rank=1) is None


class OneTask:
    """Rank 0 of a barrier stage of `world` tasks, as much of BarrierTaskContext as meet reads:
    its allGather hands back what rank 0 said."""

    def __init__(self, world: int) -> None:
        self.infos = [type("Info", (), {"address": "127.0.0.1:0"})() for _ in range(world)]

    def partitionId(self) -> int:
        return 0

    def getTaskInfos(self) -> list[object]:
        return self.infos

    def allGather(self, message: str) -> list[str]:
        return [message] * len(self.infos)


def test_rank_0_opens_its_store_on_ports_and_a_second_rank_connects() -> None:
    port = closed_port()
    meeting = meet(OneTask(world=2), f"{port}-{port}", timeout=5.0, local=True)
    try:
        assert meeting.error is None and (meeting.host, meeting.port) == ("127.0.0.1", port)
        other = Meeting("127.0.0.1", port)
        connect(other, timeout=5.0, world=2)
        assert other.store is not None
        other.store.set("seen", "yes")
        assert meeting.store.get("seen") == b"yes"
    finally:
        other.store = meeting.store = None


def test_ports_all_taken_is_one_line_naming_them() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        meeting = meet(OneTask(world=2), f"{port}-{port}", timeout=2.0, local=True)
    assert meeting.store is None and meeting.error is not None
    assert f"could not listen on any port of --ports {port}-{port}" in meeting.error
    assert meeting.error.endswith("widen --ports or free some")


def test_rank_0_state_travels_as_float32_bytes_and_is_checked(tmp_path) -> None:
    params = np.linspace(-1, 1, 1001, dtype=np.float32)
    save_checkpoint(tmp_path / "checkpoints", 40, {"params": params}, {"step": 40})
    state = final_state(str(tmp_path), Meeting("10.0.0.11", 7101))
    assert isinstance(state, FinalState) and state.step == 40
    assert state.rendezvous == "10.0.0.11:7101" and isinstance(state.params, str)
    assert np.array_equal(state_params(state, 1001), params)
    with pytest.raises(RuntimeError, match="rank 0 returned 1001 parameters; the model has 7"):
        state_params(state, 7)
    with pytest.raises(RuntimeError, match="saved no final parameters"):
        final_state(str(tmp_path / "empty"), Meeting("10.0.0.11", 7101))


def test_gloo_traffic_off_this_host_is_one_warning_whatever_encrypt_says() -> None:
    assert exposure(RunConfig(strategy="allreduce"), cluster=False) is None
    on = exposure(RunConfig(strategy="allreduce"), cluster=True)
    off = exposure(RunConfig(strategy="allreduce", encrypt=False), cluster=True)
    assert on is not None and off is not None
    assert "which neither encrypts nor authenticates" in on
    assert "--encrypt on covers ember's own connections only" in on
    assert "--encrypt off: ember's own connections are plain too" in off
