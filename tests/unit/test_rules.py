"""Server update rules against torch.optim.SGD and the EASGD equations."""

from __future__ import annotations

import torch

from ember.algorithms import EASGDRule, SGDRule, make_update_rule
from ember.config import RunConfig


def test_sgd_rule_with_momentum_matches_torch_sgd() -> None:
    torch.manual_seed(0)
    reference = torch.nn.Parameter(torch.randn(7))
    optimizer = torch.optim.SGD([reference], lr=0.1, momentum=0.9)
    params, state = reference.detach().clone(), {"momentum": torch.zeros(7)}
    rule = SGDRule(lr=0.1, momentum=0.9)
    for _ in range(4):
        grad = torch.randn(7)
        reference.grad = grad.clone()
        optimizer.step()
        rule.commit(params, state, grad, 1)
    torch.testing.assert_close(params, reference.detach())


def test_async_pushes_of_a_round_move_as_far_as_one_synchronous_step() -> None:
    grads = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, -2.0])]
    asynchronous, synchronous = torch.zeros(2), torch.zeros(2)
    for grad in grads:
        SGDRule(lr=0.5, rescale=0.5).commit(asynchronous, {}, grad, 1)
    SGDRule(lr=0.5).commit(synchronous, {}, grads[0] + grads[1], 2)
    torch.testing.assert_close(asynchronous, synchronous)


def test_only_asynchronous_consistencies_rescale_by_the_worker_count() -> None:
    assert make_update_rule(RunConfig(strategy="bsp", workers=4)).rescale == 1.0  # type: ignore[attr-defined]
    assert make_update_rule(RunConfig(strategy="ssp", workers=4)).rescale == 0.25  # type: ignore[attr-defined]
    assert make_update_rule(RunConfig(strategy="async", workers=4)).rescale == 0.25  # type: ignore[attr-defined]


def test_easgd_rule_answers_the_elastic_difference_and_moves_the_center_by_it() -> None:
    center, worker = torch.tensor([1.0, -1.0]), torch.tensor([3.0, 1.0])
    out = torch.empty(2)
    elastic = EASGDRule(alpha=0.25).contribute(center, worker, out)
    torch.testing.assert_close(elastic, torch.tensor([0.5, 0.5]))
    EASGDRule(alpha=0.25).commit(center, {}, elastic, 1)
    torch.testing.assert_close(center, torch.tensor([1.5, -0.5]))
