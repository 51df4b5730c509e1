"""Oracle tests of diloco on real servers on 127.0.0.1: against plain local training, against
parameter averaging every tau steps, and against the DiLoCo paper's outer Nesterov step, each
written in plain torch in the test."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ember.algorithms import DiLoCoRule, FlatModel, WorkerContext
from ember.algorithms.diloco import make_diloco
from ember.config import RunConfig
from ember.ps import fetch_state
from tests.conftest import SECRET, on_threads, running_servers

pytestmark = pytest.mark.timeout(60)
FEATURES, CLASSES, BATCH, LR, INNER_MOMENTUM = 6, 3, 4, 0.1, 0.9


def _model() -> torch.nn.Module:
    """A model with a BatchNorm layer, so buffers ride in every exchange."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 5),
        torch.nn.BatchNorm1d(5),
        torch.nn.Tanh(),
        torch.nn.Linear(5, CLASSES),
    )


def _data(steps: int, workers: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    rows = steps * workers * BATCH
    return (
        torch.randn(rows, FEATURES, generator=generator),
        torch.randint(0, CLASSES, (rows,), generator=generator),
    )


def _step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> None:
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    optimizer.step()


def _batch(data: tuple[torch.Tensor, torch.Tensor], step: int, rank: int, workers: int) -> tuple:
    start = (step * workers + rank) * BATCH
    return data[0][start : start + BATCH], data[1][start : start + BATCH]


def _flat(model: torch.nn.Module) -> np.ndarray:
    """Parameters then buffers, FlatModel's order, as float32."""
    parts = [p.detach().reshape(-1) for p in model.parameters()]
    parts += [b.detach().reshape(-1).float() for b in model.buffers()]
    return torch.cat(parts).numpy().copy()


def _set_flat(model: torch.nn.Module, values: np.ndarray) -> None:
    offset = 0
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            part = torch.from_numpy(values[offset : offset + tensor.numel()].copy())
            tensor.copy_(part.view_as(tensor).to(tensor.dtype))
            offset += tensor.numel()


def _inner(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=INNER_MOMENTUM)


def _diloco(
    workers: int,
    steps: int,
    tau: int,
    outer_lr: float,
    outer_momentum: float,
    shards: int = 2,
    fragments: int = 1,
    tau_policy: str = "fixed",
    algorithms: list[Any] | None = None,
    step_seconds: float = 0.0,
) -> tuple[np.ndarray, list[np.ndarray], dict[str, np.ndarray]]:
    """Run diloco (in `fragments` fragments) with `workers` workers on threads against
    `shards` real servers: the served parameters, each worker's parameters at the end, and
    the servers' whole state. Each worker's algorithm goes into `algorithms` when given; a
    period that adapts is fed `step_seconds` as each step's compute, as the worker loop
    feeds it the measured one."""
    data = _data(steps, workers)
    config = RunConfig(
        strategy="diloco", workers=workers, servers=shards, lr=LR, momentum=INNER_MOMENTUM,
        tau=tau, outer_lr=outer_lr, outer_momentum=outer_momentum, fragments=fragments,
        tau_policy=tau_policy, request_timeout=20,
    )  # fmt: skip
    flats = [FlatModel(_model(), flat_grads=False) for _ in range(workers)]
    rule = DiLoCoRule(outer_lr, outer_momentum)
    buffers_from = flats[0].param_size
    with running_servers(
        _flat(_model()), rule, "bsp", shards, buffers_from=buffers_from, expected_workers=workers
    ) as servers:
        addresses = [s.address for s in servers]

        def work(rank: int) -> None:
            flat = flats[rank]
            algorithm = make_diloco(WorkerContext(config, rank, workers, addresses, SECRET))
            if algorithms is not None:
                algorithms.append(algorithm)
            period = getattr(algorithm, "period", None)
            fed = period if period is not None and period.adaptive else None
            algorithm.start(flat, _inner(flat.module))
            for step in range(steps):
                flat.zero_grad()
                inputs, labels = _batch(data, step, rank, workers)
                F.cross_entropy(flat.module(inputs), labels).backward()
                algorithm.after_backward(step)
                if fed is not None:
                    fed.add_step(step_seconds)
            algorithm.finish()

        on_threads(work, workers)
        state = fetch_state(addresses, SECRET)[0]
    for flat in flats:
        flat.gather_buffers()
    return state["params"], [f.params_np.copy() for f in flats], state


def test_one_worker_with_outer_lr_1_and_no_momentum_equals_plain_local_training() -> None:
    # 10 steps at tau 4: two whole periods and a final one of 2 steps, pushed at the end
    steps, tau = 10, 4
    data = _data(steps, 1)
    reference = _model()
    optimizer = _inner(reference)
    for step in range(steps):
        _step(reference, optimizer, *_batch(data, step, 0, 1))
    served, (worker,), _ = _diloco(1, steps, tau, outer_lr=1.0, outer_momentum=0.0)
    np.testing.assert_allclose(served, _flat(reference), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(worker, _flat(reference), rtol=1e-5, atol=1e-6)


def test_two_workers_with_outer_lr_1_and_no_momentum_average_their_parameters_every_tau() -> None:
    steps, tau, workers = 9, 3, 2
    data = _data(steps, workers)
    models = [_model() for _ in range(workers)]
    optimizers = [_inner(m) for m in models]  # their state stays with each worker
    for step in range(steps):
        for rank, (model, optimizer) in enumerate(zip(models, optimizers, strict=True)):
            _step(model, optimizer, *_batch(data, step, rank, workers))
        if (step + 1) % tau == 0:  # parameters and BatchNorm statistics alike
            mean = sum(_flat(m) for m in models) / workers
            for model in models:
                _set_flat(model, mean)
    served, finals, _ = _diloco(workers, steps, tau, outer_lr=1.0, outer_momentum=0.0)
    np.testing.assert_allclose(served, _flat(models[0]), rtol=1e-5, atol=1e-6)
    for final in finals:  # every worker continues from the global parameters
        np.testing.assert_allclose(final, served, rtol=1e-6, atol=1e-7)
    assert not np.allclose(served, _flat(_model()))


def test_diloco_with_outer_nesterov_momentum_follows_the_papers_equations() -> None:
    # Douillard et al. 2023, Algorithm 1: each worker i runs H inner steps from theta^(t-1);
    # Delta^(t) = 1/k sum_i (theta^(t-1) - theta_i^(t)); theta^(t) = OuterOpt(theta^(t-1),
    # Delta^(t)), OuterOpt Nesterov: v = mu v + Delta; theta -= lr (Delta + mu v).
    # Buffers (BatchNorm statistics) take the workers' mean. 11 steps at H = 3: a last
    # period of 2 steps is pushed when the workers finish, and is an outer step like any.
    steps, tau, workers, outer_lr, mu = 11, 3, 2, 0.7, 0.9
    data = _data(steps, workers)
    models = [_model() for _ in range(workers)]
    optimizers = [_inner(m) for m in models]
    theta = _flat(_model())
    params = sum(p.numel() for p in models[0].parameters())
    velocity = np.zeros(params, np.float32)
    for step in range(steps):
        for rank, (model, optimizer) in enumerate(zip(models, optimizers, strict=True)):
            _step(model, optimizer, *_batch(data, step, rank, workers))
        if (step + 1) % tau == 0 or step + 1 == steps:
            delta = sum(theta - _flat(m) for m in models) / workers
            velocity = mu * velocity + delta[:params]
            theta = theta.copy()
            theta[:params] -= outer_lr * (delta[:params] + mu * velocity)
            theta[params:] -= delta[params:]
            for model in models:
                _set_flat(model, theta)
    served, _, state = _diloco(workers, steps, tau, outer_lr=outer_lr, outer_momentum=mu)
    np.testing.assert_allclose(served, theta, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state["momentum"][:params], velocity, rtol=1e-5, atol=1e-5)
