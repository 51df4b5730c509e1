"""A worker whose parameters live apart from the vector its exchanges read and write (a GPU's,
staged through host memory) trains exactly as one whose exchanges use them in place: the
staged path's copies between the two, checked on the CPU with every strategy's worker half."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ember.algorithms import FlatModel, WorkerContext, make_algorithm, make_update_rule
from ember.config import RunConfig
from ember.ps import fetch_state
from tests.conftest import SECRET, on_threads, running_servers

pytestmark = pytest.mark.timeout(60)
FEATURES, CLASSES, BATCH, WORKERS, STEPS = 6, 3, 4, 2, 9


def _model() -> nn.Module:
    """Parameters and BatchNorm buffers, float and integer, so both travel staged."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(FEATURES, 5), nn.BatchNorm1d(5), nn.Tanh(), nn.Linear(5, CLASSES)
    )


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step * WORKERS + rank)
    inputs = torch.randn(BATCH, FEATURES, generator=generator)
    return inputs, torch.randint(0, CLASSES, (BATCH,), generator=generator)


def _train(config: RunConfig, staged: bool) -> tuple[np.ndarray, list[np.ndarray]]:
    """The servers' final parameters and each worker's, after STEPS steps on threads."""
    start = FlatModel(_model(), flat_grads=False)
    flats = [
        FlatModel(_model(), flat_grads=config.mode.ships_gradients, staged=staged)
        for _ in range(WORKERS)
    ]
    rule = make_update_rule(config, STEPS)
    consistency = config.consistency.value
    with running_servers(
        start.params_np.copy(), rule, consistency, shards=2,
        buffers_from=start.param_size, expected_workers=WORKERS,
    ) as servers:  # fmt: skip
        addresses = [s.address for s in servers]

        def work(rank: int) -> None:
            flat = flats[rank]
            algorithm = make_algorithm(WorkerContext(config, rank, WORKERS, addresses, SECRET))
            local = config.mode.local_optimizer
            optimizer = torch.optim.SGD(flat.module.parameters(), lr=config.lr)
            algorithm.start(flat, optimizer if local else None)
            for step in range(STEPS):
                flat.zero_grad()
                inputs, labels = _batch(step, rank)
                F.cross_entropy(flat.module(inputs), labels).backward()
                algorithm.after_backward(step)
            algorithm.finish()

        on_threads(work, WORKERS)
        served = fetch_state(addresses, SECRET)[0]["params"]
    kept = []
    for flat in flats:
        flat.gather_buffers()
        kept.append(flat.to_host().copy())
    return served, kept


@pytest.mark.parametrize(
    "fields",
    [
        {"strategy": "bsp"},
        {"strategy": "bsp", "compress": "int8", "n_fetch": 2},
        {"strategy": "easgd", "tau": 3},
        {"strategy": "easgd", "tau": 3, "compress": "int8"},
        {"strategy": "diloco", "tau": 3},
    ],
    ids=["bsp", "bsp-int8-fetch2", "easgd", "easgd-int8", "diloco"],
)
def test_a_staged_worker_trains_exactly_as_one_that_exchanges_in_place(fields) -> None:
    config = RunConfig(workers=WORKERS, lr=0.1, momentum=0.0, **fields)
    in_place_served, in_place = _train(config.validate(), staged=False)
    staged_served, staged = _train(config, staged=True)
    assert not np.allclose(in_place_served, FlatModel(_model()).params_np)  # it trained
    np.testing.assert_array_equal(staged_served, in_place_served)
    for ours, theirs in zip(staged, in_place, strict=True):
        np.testing.assert_array_equal(ours, theirs)


def test_what_a_staged_flat_model_hands_over_is_the_vector_as_it_was_then() -> None:
    flat = FlatModel(_model(), staged=True)
    flat.gather_buffers()
    before = flat.params.numpy().copy()
    flat.hand_over()
    with torch.no_grad():
        flat.params += 1.0  # compute goes on while the exchanger copies
    taken = np.empty(flat.size, np.float32)
    flat.take_over(taken)
    np.testing.assert_array_equal(taken, before)


def test_a_staged_flat_model_subtracts_where_the_parameters_are_not_in_its_stale_copy() -> None:
    """easgd-async applies e after compute moved on from the snapshot: only x -= e, never the
    host copy written back over the steps taken since."""
    flat = FlatModel(_model(), staged=True)
    flat.gather_buffers()
    snapshot = flat.to_host().copy()
    with torch.no_grad():
        flat.params += 1.0  # steps taken after the snapshot
    moved = flat.params.numpy().copy()
    elastic = np.full(flat.size, 0.25, np.float32)
    flat.subtract(elastic)
    np.testing.assert_array_equal(flat.params.numpy(), moved - elastic)
    np.testing.assert_array_equal(flat.params_np, snapshot)  # the host copy was not used


@pytest.mark.parametrize("staged", [False, True], ids=["in-place", "staged"])
def test_easgd_async_sends_the_parameters_its_worker_holds(staged) -> None:
    """At alpha 1 the center becomes what a worker sends: with tau past the run's steps, the
    one exchange is the final one, of the parameters as training left them."""
    steps = 6
    config = RunConfig(strategy="easgd-async", workers=1, lr=0.1, tau=100, alpha=1.0).validate()
    start = FlatModel(_model(), flat_grads=False)
    with running_servers(
        start.params_np.copy(), make_update_rule(config, steps), "async",
        buffers_from=start.param_size, expected_workers=1,
    ) as (server,):  # fmt: skip
        flat = FlatModel(_model(), flat_grads=False, staged=staged)
        algorithm = make_algorithm(WorkerContext(config, 0, 1, [server.address], SECRET))
        algorithm.start(flat, torch.optim.SGD(flat.module.parameters(), lr=config.lr))
        for step in range(steps):
            flat.zero_grad()
            inputs, labels = _batch(step, 0)
            F.cross_entropy(flat.module(inputs), labels).backward()
            algorithm.after_backward(step)
        flat.gather_buffers()
        trained = flat.params.numpy().copy()  # where the parameters are (staged: not params_np)
        algorithm.finish()
        served = fetch_state([server.address], SECRET)[0]["params"]
    assert not np.allclose(trained, start.params_np)
    np.testing.assert_allclose(served, trained, rtol=1e-6, atol=1e-6)
