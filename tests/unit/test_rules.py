"""Server update rules against torch.optim.SGD and the EASGD equations."""

from __future__ import annotations

import numpy as np
import torch

from ember.algorithms import EASGDRule, SGDRule, make_update_rule
from ember.config import RunConfig

F32 = np.float32


def test_sgd_rule_with_momentum_matches_torch_sgd() -> None:
    torch.manual_seed(0)
    reference = torch.nn.Parameter(torch.randn(7))
    optimizer = torch.optim.SGD([reference], lr=0.1, momentum=0.9)
    params, state = reference.detach().numpy().copy(), {"momentum": np.zeros(7, F32)}
    rule, scratch = SGDRule(lr=0.1, momentum=0.9), np.empty(7, F32)
    for _ in range(4):
        grad = torch.randn(7)
        reference.grad = grad.clone()
        optimizer.step()
        rule.commit(params, state, grad.numpy(), 1, scratch)
    assert params.dtype == F32 and state["momentum"].dtype == F32
    np.testing.assert_allclose(params, reference.detach().numpy(), rtol=1e-6, atol=1e-7)


def test_async_pushes_of_a_round_move_as_far_as_one_synchronous_step() -> None:
    grads = [np.array([1.0, 2.0], F32), np.array([3.0, -2.0], F32)]
    asynchronous, synchronous, scratch = np.zeros(2, F32), np.zeros(2, F32), np.empty(2, F32)
    for grad in grads:
        SGDRule(lr=0.5, rescale=0.5).commit(asynchronous, {}, grad, 1, scratch)
    SGDRule(lr=0.5).commit(synchronous, {}, grads[0] + grads[1], 2, scratch)
    np.testing.assert_allclose(asynchronous, synchronous)
    np.testing.assert_allclose(synchronous, [-1.0, 0.0])


def test_the_rules_read_a_read_only_payload_and_write_only_their_outputs() -> None:
    payload = np.array([2.0, 4.0], F32)
    payload.flags.writeable = False  # a view of a receive buffer
    params, scratch = np.zeros(2, F32), np.empty(2, F32)
    SGDRule(lr=0.5).commit(params, {}, payload, 1, scratch)
    np.testing.assert_array_equal(params, [-1.0, -2.0])
    out = np.empty(2, F32)
    elastic = EASGDRule(alpha=0.5).contribute(params, payload, out)
    assert elastic is out
    np.testing.assert_array_equal(out, [1.5, 3.0])


def test_only_asynchronous_consistencies_rescale_by_the_worker_count() -> None:
    assert make_update_rule(RunConfig(strategy="bsp", workers=4)).rescale == 1.0  # type: ignore[attr-defined]
    assert make_update_rule(RunConfig(strategy="ssp", workers=4)).rescale == 0.25  # type: ignore[attr-defined]
    assert make_update_rule(RunConfig(strategy="async", workers=4)).rescale == 0.25  # type: ignore[attr-defined]


def test_easgd_rule_answers_the_elastic_difference_and_moves_the_center_by_it() -> None:
    center, worker = np.array([1.0, -1.0], F32), np.array([3.0, 1.0], F32)
    out = np.empty(2, F32)
    elastic = EASGDRule(alpha=0.25).contribute(center, worker, out)
    np.testing.assert_allclose(elastic, [0.5, 0.5])
    EASGDRule(alpha=0.25).commit(center, {}, elastic, 1, np.empty(2, F32))
    np.testing.assert_allclose(center, [1.5, -0.5])
