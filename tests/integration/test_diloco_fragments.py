"""Streaming diloco (--fragments) on real servers on 127.0.0.1, against a reference in plain torch
of its staggered syncs and its mixing rule, x_f = g_f + (x_f - s_f), applied a stagger later."""

from __future__ import annotations

import numpy as np
import pytest

from tests.integration.test_diloco_oracles import (
    _batch,
    _data,
    _diloco,
    _flat,
    _inner,
    _model,
    _set_flat,
    _step,
)

pytestmark = pytest.mark.timeout(60)
FRAGMENTS, TAU, STEPS = 2, 4, 11  # fragment 0 syncs after steps 2, 6, 10; fragment 1 after 4, 8


def _reference(workers: int, outer_lr: float, mu: float) -> tuple[np.ndarray, list[np.ndarray]]:
    """The staggered syncs written out: after every stagger = tau / F steps, the fragment in
    flight is merged, x_f += g_f - s_f, then the next fragment's round runs (Douillard et al.'s
    outer Nesterov step on its parameter keys, the mean on its buffer keys). At the end, every
    fragment with steps since its last sync is pushed once more."""
    data = _data(STEPS, workers)
    models = [_model() for _ in range(workers)]
    optimizers = [_inner(m) for m in models]
    theta = _flat(_model()).astype(np.float64)
    size, params = theta.size, sum(p.numel() for p in models[0].parameters())
    halves = [slice(0, size // 2), slice(size // 2, size)]  # one server each
    velocity, start = np.zeros(size), theta.copy()
    sent: list[np.ndarray] = [np.zeros(size) for _ in models]
    synced, in_flight = [0] * FRAGMENTS, None

    def round_(keys: slice, deltas: list[np.ndarray]) -> None:
        mean = sum(d[keys] for d in deltas) / workers
        for key, value in zip(range(keys.start, keys.stop), mean, strict=True):
            if key < params:
                velocity[key] = mu * velocity[key] + value
                theta[key] -= outer_lr * (value + mu * velocity[key])
            else:
                theta[key] -= value

    def merge(fragment: int) -> None:
        keys = halves[fragment]
        for model, was in zip(models, sent, strict=True):
            x = _flat(model).astype(np.float64)
            x[keys] += theta[keys] - was[keys]
            _set_flat(model, x.astype(np.float32))
        start[keys] = theta[keys]

    for step in range(STEPS):
        for rank, (model, optimizer) in enumerate(zip(models, optimizers, strict=True)):
            _step(model, optimizer, *_batch(data, step, rank, workers))
        done = step + 1
        if done % (TAU // FRAGMENTS):
            continue
        if in_flight is not None:
            merge(in_flight)
        in_flight = (done // (TAU // FRAGMENTS) - 1) % FRAGMENTS
        sent = [_flat(m).astype(np.float64) for m in models]
        round_(halves[in_flight], [start - x for x in sent])
        synced[in_flight] = done
    if in_flight is not None:
        merge(in_flight)
    for fragment, keys in enumerate(halves):
        if synced[fragment] != STEPS:
            round_(keys, [start - _flat(m).astype(np.float64) for m in models])
    return theta, [_flat(m) for m in models]


@pytest.mark.parametrize(
    ("workers", "outer_lr", "mu"), [(1, 1.0, 0.0), (2, 1.0, 0.0), (2, 0.7, 0.9)]
)
def test_fragments_sync_at_staggered_steps_and_merge_by_the_mixing_rule(
    workers: int, outer_lr: float, mu: float
) -> None:
    served, finals, _ = _diloco(workers, STEPS, TAU, outer_lr, mu, FRAGMENTS, FRAGMENTS)
    theta, locals_ = _reference(workers, outer_lr, mu)
    np.testing.assert_allclose(served, theta, rtol=1e-4, atol=1e-5)
    for final, expected in zip(finals, locals_, strict=True):
        np.testing.assert_allclose(final, expected, rtol=1e-4, atol=1e-5)


def test_one_worker_with_outer_lr_1_and_no_momentum_is_still_plain_local_training() -> None:
    data = _data(STEPS, 1)
    reference = _model()
    optimizer = _inner(reference)
    for step in range(STEPS):
        _step(reference, optimizer, *_batch(data, step, 0, 1))
    served, (final,), _ = _diloco(1, STEPS, TAU, 1.0, 0.0, FRAGMENTS, FRAGMENTS)
    np.testing.assert_allclose(served, _flat(reference), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(final, _flat(reference), rtol=1e-5, atol=1e-6)
