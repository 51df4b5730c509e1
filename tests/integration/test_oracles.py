"""Oracle tests: ember's strategies against references written from their equations."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ember.algorithms import (
    AsyncEASGD,
    EASGDRule,
    FlatModel,
    ServerSGD,
    SGDRule,
    SyncEASGD,
    WorkerContext,
)
from ember.config import RunConfig
from ember.ps import PSClient, fetch_state
from tests.conftest import SECRET, on_threads, running_servers

pytestmark = pytest.mark.timeout(60)
FEATURES, CLASSES, BATCH, WORKERS = 6, 3, 4, 2


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 5), torch.nn.Tanh(), torch.nn.Linear(5, CLASSES)
    )


def _data(steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    rows = steps * WORKERS * BATCH
    return (
        torch.randn(rows, FEATURES, generator=generator),
        torch.randint(0, CLASSES, (rows,), generator=generator),
    )


def _batch(
    x: torch.Tensor, y: torch.Tensor, step: int, worker: int
) -> tuple[torch.Tensor, torch.Tensor]:
    start = (step * WORKERS + worker) * BATCH
    return x[start : start + BATCH], y[start : start + BATCH]


def _run_workers(
    algorithm: Callable[[WorkerContext], object],
    config: RunConfig,
    addresses: list[str],
    steps: int,
    x: torch.Tensor,
    y: torch.Tensor,
    optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer | None],
    starts: dict[int, np.ndarray] | None = None,
    staged: bool = False,
) -> list[FlatModel]:
    """Run WORKERS workers on threads; `starts` receives each one's parameters after start().
    `staged`: their exchanges go through a host copy of the parameters, as on a GPU."""
    flats = [FlatModel(_model(), staged=staged) for _ in range(WORKERS)]

    def work(rank: int) -> None:
        flat = flats[rank]
        algo = algorithm(WorkerContext(config, rank, WORKERS, addresses, SECRET))
        algo.start(flat, optimizer(flat.module))  # type: ignore[attr-defined]
        if starts is not None:
            starts[rank] = flat.to_host().copy()
        for step in range(steps):
            flat.zero_grad()
            inputs, labels = _batch(x, y, step, rank)
            F.cross_entropy(flat.module(inputs), labels).backward()
            algo.after_backward(step)  # type: ignore[attr-defined]
        algo.finish()  # type: ignore[attr-defined]

    on_threads(work, WORKERS)
    return flats


def _flat(module: torch.nn.Module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()]).numpy()


def test_bsp_with_n_workers_on_equal_shards_equals_single_process_sgd_on_the_whole_batch() -> None:
    steps, lr, momentum = 8, 0.1, 0.9
    x, y = _data(steps)
    reference = _model()
    optimizer = torch.optim.SGD(reference.parameters(), lr=lr, momentum=momentum)
    for step in range(steps):
        batches = [_batch(x, y, step, w) for w in range(WORKERS)]
        inputs = torch.cat([b[0] for b in batches])
        labels = torch.cat([b[1] for b in batches])
        optimizer.zero_grad()
        F.cross_entropy(reference(inputs), labels).backward()
        optimizer.step()

    config = RunConfig(
        strategy="bsp", workers=WORKERS, lr=lr, momentum=momentum, request_timeout=20
    )
    initial = _flat(_model())
    with running_servers(
        initial, SGDRule(lr, momentum), "bsp", shards=2, expected_workers=WORKERS
    ) as servers:
        addresses = [s.address for s in servers]
        flats = _run_workers(ServerSGD, config, addresses, steps, x, y, lambda m: None)
        center = fetch_state(addresses, SECRET)[0]["params"]
    np.testing.assert_allclose(center, _flat(reference), rtol=1e-5, atol=1e-6)
    for flat in flats:  # every worker pulled the same parameters after the last round
        np.testing.assert_allclose(flat.params_np, center, rtol=1e-6, atol=1e-7)


def test_synchronous_easgd_matches_the_papers_update_equations() -> None:
    steps, lr, tau, alpha = 9, 0.1, 3, 0.3
    x, y = _data(steps)
    # Zhang, Choromanska, LeCun (2015), synchronous EASGD: local SGD steps; every tau steps
    # x_i <- x_i - alpha (x_i - c) and c <- c + alpha * sum_i (x_i - c), with the same c.
    workers = [_model() for _ in range(WORKERS)]
    center = _flat(_model()).copy()
    for step in range(steps):
        for rank, model in enumerate(workers):
            model.zero_grad()
            inputs, labels = _batch(x, y, step, rank)
            F.cross_entropy(model(inputs), labels).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= lr * p.grad
        if (step + 1) % tau == 0:
            diffs = [alpha * (_flat(m) - center) for m in workers]
            for model, diff in zip(workers, diffs, strict=True):
                _set_flat(model, _flat(model) - diff)
            center = center + sum(diffs)

    config = RunConfig(
        strategy="easgd",
        workers=WORKERS,
        lr=lr,
        momentum=0.0,
        tau=tau,
        alpha=alpha,
        request_timeout=20,
    )
    with running_servers(
        _flat(_model()), EASGDRule(alpha), "bsp", shards=2, expected_workers=WORKERS
    ) as servers:
        addresses = [s.address for s in servers]
        flats = _run_workers(
            SyncEASGD,
            config,
            addresses,
            steps,
            x,
            y,
            lambda m: torch.optim.SGD(m.parameters(), lr=lr),
        )
        served = fetch_state(addresses, SECRET)[0]["params"]
    np.testing.assert_allclose(served, center, rtol=1e-5, atol=1e-6)
    for flat, model in zip(flats, workers, strict=True):
        np.testing.assert_allclose(flat.params_np, _flat(model), rtol=1e-5, atol=1e-6)


def test_asynchronous_easgd_server_applies_each_exchange_as_the_equations_say() -> None:
    alpha = 0.25
    rng = np.random.default_rng(3)
    center = rng.standard_normal(50).astype(np.float32)
    with running_servers(center, EASGDRule(alpha), "async", expected_workers=WORKERS) as (server,):
        clients = [PSClient([server.address], SECRET, worker=w, timeout=5) for w in range(2)]
        for client in clients:
            client.register()
        expected = center.copy()
        for worker in (0, 1, 1, 0, 1):
            x_i = rng.standard_normal(50).astype(np.float32)
            elastic = np.empty(50, dtype=np.float32)
            clients[worker].push(x_i, reply_into=elastic)
            reference = alpha * (x_i - expected)  # e = alpha (x_i - c); x_i -= e; c += e
            np.testing.assert_allclose(elastic, reference, rtol=1e-6, atol=1e-6)
            expected = expected + reference
        served = fetch_state([server.address], SECRET)[0]["params"]
        for client in clients:
            client.close()
    np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("staged", [False, True], ids=["in-place", "staged"])
def test_asynchronous_easgd_worker_applies_every_elastic_difference_exactly_once(staged) -> None:
    # Each exchange moves x_i by -e and the center by +e, so center + sum_i x_i changes only by
    # the workers' own optimizer steps: a lost or doubled exchange breaks this balance.
    steps, lr = 40, 0.05
    x, y = _data(steps)
    module_moves: dict[int, np.ndarray] = {}  # id(module) -> sum of its optimizer steps

    def recording_optimizer(module: torch.nn.Module) -> torch.optim.Optimizer:
        module_moves[id(module)] = np.zeros_like(_flat(module))
        optimizer = torch.optim.SGD(module.parameters(), lr=lr, momentum=0.5)
        original = optimizer.step

        def step(closure=None):
            before = _flat(module).copy()
            result = original(closure)
            module_moves[id(module)] += _flat(module) - before
            return result

        optimizer.step = step  # type: ignore[method-assign]
        return optimizer

    config = RunConfig(
        strategy="easgd-async", workers=WORKERS, lr=lr, tau=2, alpha=0.4, request_timeout=20
    )
    initial = _flat(_model())
    starts: dict[int, np.ndarray] = {}  # each worker starts at the center as it pulls it, which
    # another worker's first exchange may already have moved
    with running_servers(initial, EASGDRule(0.4), "async", expected_workers=WORKERS) as (server,):
        flats = _run_workers(
            AsyncEASGD, config, [server.address], steps, x, y, recording_optimizer, starts, staged
        )
        served = fetch_state([server.address], SECRET)[0]["params"]
    total_moves = sum(module_moves[id(f.module)] for f in flats)
    balance = served + sum(f.to_host() for f in flats)
    np.testing.assert_allclose(balance, initial + sum(starts.values()) + total_moves, atol=2e-4)
    assert not np.allclose(served, initial)  # the center did move


def _set_flat(module: torch.nn.Module, values: np.ndarray) -> None:
    offset = 0
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.from_numpy(values[offset : offset + p.numel()]).view_as(p))
            offset += p.numel()


@pytest.mark.parametrize("staged", [False, True], ids=["in-place", "staged"])
@pytest.mark.parametrize("compress", ["none", "int8"])
def test_worker_zero_knows_the_center_of_its_latest_exchange(compress: str, staged) -> None:
    # The center worker 0 evaluates is derived from its exchanges, not fetched: alone with the
    # server, its last exchange leaves the center it derives equal to the served one.
    steps, lr, alpha = 12, 0.1, 0.3
    x, y = _data(steps)
    config = RunConfig(
        strategy="easgd-async", workers=1, lr=lr, tau=4, alpha=alpha, compress=compress,
        request_timeout=20,
    )  # fmt: skip
    with running_servers(_flat(_model()), EASGDRule(alpha), "async", expected_workers=1) as (
        server,
    ):
        flat = FlatModel(_model(), staged=staged)  # staged: the exchanger copies x_i to the host
        algorithm = AsyncEASGD(WorkerContext(config, 0, 1, [server.address], SECRET))
        algorithm.start(flat, torch.optim.SGD(flat.module.parameters(), lr=lr))
        assert algorithm.center is None  # no exchange yet: worker 0 evaluates its own
        for step in range(steps):
            flat.zero_grad()
            F.cross_entropy(
                flat.module(_batch(x, y, step, 0)[0]), _batch(x, y, step, 0)[1]
            ).backward()
            algorithm.after_backward(step)
        algorithm.finish()
        served = fetch_state([server.address], SECRET)[0]["params"]
    assert algorithm.center is not None
    assert not np.allclose(served, _flat(_model()))  # the center did move
    # int8: e as decoded and x_i as sent differ from the server's by its rounding, over alpha
    tolerance = 1e-6 if compress == "none" else 5e-3 * np.abs(served).max()
    np.testing.assert_allclose(algorithm.center, served, atol=tolerance)


def test_synchronous_easgd_worker_zero_knows_the_center_its_last_round_met() -> None:
    steps, lr, tau, alpha = 6, 0.1, 3, 0.3
    x, y = _data(steps)
    config = RunConfig(
        strategy="easgd", workers=WORKERS, lr=lr, momentum=0.0, tau=tau, alpha=alpha,
        request_timeout=20,
    )  # fmt: skip
    algorithms: list[SyncEASGD] = []

    def keep(context: WorkerContext) -> SyncEASGD:
        algorithms.append(SyncEASGD(context))
        return algorithms[-1]

    with running_servers(_flat(_model()), EASGDRule(alpha), "bsp", expected_workers=WORKERS) as (
        server,
    ):
        flats = _run_workers(
            keep, config, [server.address], steps, x, y,
            lambda m: torch.optim.SGD(m.parameters(), lr=lr),
        )  # fmt: skip
        served = fetch_state([server.address], SECRET)[0]["params"]
    # the last round moved the center by alpha * sum_i (x_i - c): c = served - that sum
    (zero,) = [a for a in algorithms if a.context.rank == 0]
    assert zero.center is not None
    moved = sum(a.elastic for a in algorithms)
    np.testing.assert_allclose(zero.center, served - moved, rtol=1e-5, atol=1e-6)
    assert not np.allclose(zero.center, flats[0].params_np)
