"""A worker's last steps reach the servers: a final exchange (easgd) or push (sgd) at finish."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ember.algorithms import EASGDRule, FlatModel, WorkerContext, make_algorithm, make_update_rule
from ember.config import RunConfig
from ember.metrics import read_metrics
from ember.ps import fetch_state
from ember.worker.evaluation import evaluate
from ember.worker.loop import make_model
from ember.worker.spec import load_data
from tests.conftest import SECRET, running_servers

pytestmark = pytest.mark.timeout(60)
FEATURES, CLASSES, BATCH, LR = 6, 3, 4, 0.1


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, CLASSES))


def _flat(module: torch.nn.Module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()]).numpy().copy()


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * rank + step)
    return (
        torch.randn(BATCH, FEATURES, generator=generator),
        torch.randint(0, CLASSES, (BATCH,), generator=generator),
    )


def _gradient(params: np.ndarray, rank: int, step: int) -> np.ndarray:
    model = _model()
    torch.nn.utils.vector_to_parameters(torch.from_numpy(params.copy()), model.parameters())
    inputs, labels = _batch(rank, step)
    F.cross_entropy(model(inputs), labels).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).numpy()


def _train(config: RunConfig, addresses: list[str], steps: list[int]) -> list:
    """Run one worker per entry of `steps` (its step count) on threads; return the algorithms."""
    algorithms = [
        make_algorithm(WorkerContext(config, rank, len(steps), addresses, SECRET))
        for rank in range(len(steps))
    ]
    errors: list[BaseException] = []

    def work(rank: int) -> None:
        try:
            flat = FlatModel(_model())
            local = config.algorithm == "easgd"
            optimizer = torch.optim.SGD(flat.module.parameters(), lr=LR) if local else None
            algorithms[rank].start(flat, optimizer)
            for step in range(steps[rank]):
                flat.zero_grad()
                inputs, labels = _batch(rank, step)
                F.cross_entropy(flat.module(inputs), labels).backward()
                algorithms[rank].after_backward(step)
            algorithms[rank].finish()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(rank,)) for rank in range(len(steps))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(t.is_alive() for t in threads), "a worker hung"
    assert not errors, errors
    return algorithms


def _exchange_steps(steps: int, tau: int) -> list[int]:
    """Every tau-th step, and the last step when it is not one of them."""
    regular = list(range(tau, steps + 1, tau))
    return regular if steps % tau == 0 else [*regular, steps]


def test_synchronous_easgd_workers_with_unequal_step_counts_each_make_a_final_exchange() -> None:
    # 5 and 9 steps with tau 4: exchanges after steps 4, 5 and 4, 8, 9. Round k of the
    # paper's equations holds every worker's k-th exchange, all against the same center.
    steps, tau, alpha = [5, 9], 4, 0.3
    workers = [_flat(_model()) for _ in steps]
    center, done = _flat(_model()), [0, 0]
    schedules = [_exchange_steps(s, tau) for s in steps]
    for round_ in range(max(map(len, schedules))):
        members = [r for r, schedule in enumerate(schedules) if round_ < len(schedule)]
        for rank in members:
            for step in range(done[rank], schedules[rank][round_]):
                workers[rank] = workers[rank] - LR * _gradient(workers[rank], rank, step)
            done[rank] = schedules[rank][round_]
        diffs = {rank: alpha * (workers[rank] - center) for rank in members}
        for rank, diff in diffs.items():
            workers[rank] = workers[rank] - diff
        center = center + sum(diffs.values())

    config = RunConfig(strategy="easgd", workers=2, lr=LR, momentum=0.0, tau=tau, alpha=alpha)
    with running_servers(_flat(_model()), EASGDRule(alpha), "bsp", expected_workers=2) as servers:
        addresses = [s.address for s in servers]
        algorithms = _train(config, addresses, steps)
        served = fetch_state(addresses, SECRET)[0]["params"]
    assert [a.stats.exchanges for a in algorithms] == [2, 3]
    np.testing.assert_allclose(served, center, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("strategy", ["easgd", "easgd-async"])
def test_easgd_with_fewer_steps_than_tau_moves_the_center_to_the_final_parameters(
    strategy,
) -> None:
    steps, tau, alpha = 3, 8, 0.5
    local = _flat(_model())
    for step in range(steps):
        local = local - LR * _gradient(local, 0, step)
    initial = _flat(_model())
    config = RunConfig(strategy=strategy, workers=1, lr=LR, momentum=0.0, tau=tau, alpha=alpha)
    rule = EASGDRule(alpha)
    with running_servers(initial, rule, config.consistency, expected_workers=1) as servers:
        addresses = [s.address for s in servers]
        (worker,) = _train(config, addresses, [steps])
        served = fetch_state(addresses, SECRET)[0]["params"]
    assert worker.stats.exchanges == 1
    np.testing.assert_allclose(served, initial + alpha * (local - initial), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("strategy", ["easgd", "easgd-async"])
def test_easgd_whose_last_step_was_an_exchange_does_not_exchange_again(strategy) -> None:
    config = RunConfig(strategy=strategy, workers=2, lr=LR, momentum=0.0, tau=3, alpha=0.4)
    rule = EASGDRule(0.4)
    with running_servers(_flat(_model()), rule, config.consistency, expected_workers=2) as (
        server,
    ):
        algorithms = _train(config, [server.address], [6, 6])
    assert [a.stats.exchanges for a in algorithms] == [2, 2]


@pytest.mark.parametrize("strategy", ["bsp", "ssp", "async"])
def test_sgd_with_n_push_pushes_the_remaining_gradients_when_it_finishes(strategy) -> None:
    # n_push 2 over 5 steps: pushes after steps 2, 4 and, at finish, the mean of step 5's
    # remainder; the server's SGD applies each, and the worker pulls after every step.
    steps, n_push = 5, 2
    params, server, accumulated = _flat(_model()), _flat(_model()), []
    for step in range(steps):
        accumulated.append(_gradient(params, 0, step))
        if (step + 1) % n_push == 0 or step + 1 == steps:
            server = server - LR * np.mean(accumulated, axis=0)
            accumulated = []
        params = server  # n_fetch 1: the worker pulls the server's parameters every step

    config = RunConfig(strategy=strategy, workers=1, lr=LR, momentum=0.0, n_push=n_push)
    rule = make_update_rule(config)
    with running_servers(_flat(_model()), rule, config.consistency, expected_workers=1) as servers:
        addresses = [s.address for s in servers]
        (worker,) = _train(config, addresses, [steps])
        served = fetch_state(addresses, SECRET)[0]["params"]
    assert worker.stats.exchanges == 6  # 3 pushes (2 with a pull) and 3 bare pulls
    np.testing.assert_allclose(served, server, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("strategy", ["easgd", "easgd-async"])
def test_a_run_shorter_than_tau_reports_a_trained_center_not_the_initial_model(
    tmp_path, strategy
) -> None:
    # digits in batches of 500: 10 steps per worker, far fewer than tau 100
    out = tmp_path / "run"
    args = ["--data", "digits", "--epochs", "1", "--batch-size", "500", "--tau", "100"]
    done = subprocess.run(
        [sys.executable, "-m", "ember", "train", *args, "--strategy", strategy, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    (last_eval,) = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "eval"]
    config = RunConfig(data="digits")
    dataset = load_data(config)
    initial = evaluate(
        make_model(config.model, config.seed, dataset), dataset.x_test, dataset.y_test
    )["test_accuracy"]
    assert summary["exchanges"] == 2  # one final exchange per worker
    assert summary["test_accuracy"] > initial + 0.3
    assert abs(summary["test_accuracy"] - last_eval["test_accuracy"]) < 0.1
