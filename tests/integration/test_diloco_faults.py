"""diloco under faults: a worker killed mid-period, and a primary server killed with a backup
that holds the outer momentum."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ember.algorithms import DiLoCo, DiLoCoRule, FlatModel, WorkerContext
from ember.config import RunConfig
from ember.ps import PSClient, control, fetch_state
from tests.conftest import SECRET, running_servers
from tests.integration.test_faults import kill_mid_run, restarts
from tests.integration.test_replication import _await_copy, _state, _until, replicated

pytestmark = pytest.mark.timeout(240)
F32 = np.float32
TAU = 40  # digits: 78 steps an epoch per worker, so 15 rounds in 8 epochs


def _mid_second_period(out: Path) -> bool:
    """Worker 1 reported a step past its first exchange and short of the next."""
    metrics = out / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    records = [json.loads(line) for line in lines[:-1]]  # the last may be half written
    ones = [r["step"] for r in records if r.get("kind") == "worker" and r["rank"] == 1]
    return any(TAU < step < 2 * TAU for step in ones)


@pytest.mark.parametrize("fragments", [1, 2])
def test_a_diloco_worker_killed_mid_period_rejoins_from_the_global_parameters(
    tmp_path, fragments: int
) -> None:
    flags = ("--strategy", "diloco", "--tau", str(TAU), "--epochs", "8", "--log-every", "5")
    flags += ("--fragments", str(fragments), "--servers", str(fragments))
    out = tmp_path / "run"
    summary, records = kill_mid_run(out, flags, ("worker-1.log",), _mid_second_period)
    assert restarts(records) == [(1, 1)]
    (again,) = [r for r in records if r.get("kind") == "start" and r["incarnation"] == 1]
    # It resumes where the servers last heard from it, a period's end (with fragments, that
    # of the fragment synced longest ago), with the global parameters it pulls there; the
    # local steps it took since are not kept.
    stagger = TAU // fragments
    assert again["rank"] == 1 and again["first_step"] % stagger == 0
    assert again["first_step"] >= TAU - stagger
    assert summary["worker_restarts"] == 1
    assert summary["test_accuracy"] > 0.85


def test_a_restarted_worker_starts_from_the_global_parameters_at_its_last_exchange() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    config = RunConfig(strategy="diloco", workers=1, tau=2, outer_lr=0.7, request_timeout=20)
    start = FlatModel(model, flat_grads=False).params_np.copy()
    with running_servers(start, DiLoCoRule(0.7, 0.9), "bsp", expected_workers=1) as (server,):
        flat = FlatModel(model, flat_grads=False)
        first = DiLoCo(WorkerContext(config, 0, 1, [server.address], SECRET))
        first.start(flat, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
        for step in range(5):  # rounds at steps 2 and 4, then one step of a third period
            flat.zero_grad()
            F.cross_entropy(model(x), y).backward()
            first.after_backward(step)
        assert first.client is not None
        first.client.close()  # killed: no final push, no goodbye
        served = fetch_state([server.address], SECRET)[0]["params"]
        assert not np.allclose(flat.params_np, served)  # its own step 5 is not the servers'
        again = DiLoCo(WorkerContext(config, 0, 1, [server.address], SECRET, incarnation=1))
        fresh = FlatModel(torch.nn.Sequential(torch.nn.Linear(4, 3)), flat_grads=False)
        resumed = again.start(fresh, None)
        assert again.client is not None
        again.client.close()
    assert resumed == 4
    np.testing.assert_array_equal(fresh.params_np, served)
    assert not np.allclose(served, start)


def test_a_killed_diloco_primary_fails_over_to_its_replica_and_training_goes_on(tmp_path) -> None:
    flags = ("--strategy", "diloco", "--tau", str(TAU), "--epochs", "8", "--replicas", "2")
    summary, records = kill_mid_run(tmp_path / "run", flags, ("server-0.log",))
    events = [(r["event"], r["server"]) for r in records if r.get("kind") == "server"]
    assert events[0] == ("promoted", "ember-server-0-replica-1")
    assert restarts(records) == []
    assert summary["test_accuracy"] > 0.85


def _outer(theta: np.ndarray, velocity: np.ndarray, delta: np.ndarray) -> tuple:
    """The paper's outer Nesterov step: v = mu v + Delta; theta -= lr (Delta + mu v)."""
    velocity = 0.9 * velocity + delta
    return theta - 0.7 * (delta + 0.9 * velocity), velocity


def test_a_promoted_backup_keeps_the_outer_momentum_for_the_next_round() -> None:
    size = 16
    start = np.linspace(-1, 1, size, dtype=F32)
    rng = np.random.default_rng(5)
    deltas = [rng.standard_normal(size).astype(F32) for _ in range(3)]
    rule = DiLoCoRule(lr=0.7, momentum=0.9)
    with replicated(start, rule, consistency="bsp", expected_workers=1) as shard:
        both = f"{shard.primary.address},{shard.backup.address}"
        client = PSClient([both], SECRET, worker=0, timeout=10)
        client.register()
        pulled = np.empty(size, F32)
        for delta in deltas[:2]:
            client.push(delta, pulled, pull=True)
        copy, _ = _await_copy(shard)
        shard.kill_primary()
        _until(client.connections[0]._disconnected)
        control([shard.backup.address], SECRET, "promote")
        client.push(deltas[2], pulled, pull=True)  # the third round, on the promoted backup
        assert client.failovers == 1
        state, _ = _state(shard.backup.address)
        client.close()
    theta, velocity = start.astype(np.float64), np.zeros(size)
    for delta in deltas[:2]:
        theta, velocity = _outer(theta, velocity, delta)
    np.testing.assert_allclose(copy["momentum"], velocity, rtol=1e-5, atol=1e-6)
    forgotten, _ = _outer(theta, np.zeros(size), deltas[2])  # a backup without the momentum
    theta, velocity = _outer(theta, velocity, deltas[2])
    np.testing.assert_allclose(pulled, theta, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state["momentum"], velocity, rtol=1e-5, atol=1e-5)
    assert not np.allclose(pulled, forgotten, atol=1e-2)
