"""DiLoCo's outer step on the servers against the paper's equations and torch.optim.SGD, and the
configuration that names it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember.algorithms import DiLoCoRule, make_update_rule
from ember.config import RunConfig, make_config
from ember.errors import ConfigError

F32 = np.float32


def _rounds(workers: int, rounds: int, size: int) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(7)
    return [[rng.standard_normal(size).astype(F32) for _ in range(workers)] for _ in range(rounds)]


def test_the_outer_step_is_nesterov_sgd_on_the_rounds_mean_pseudo_gradient() -> None:
    # Douillard et al. 2023: Delta = 1/k sum_i (theta - theta_i); v = mu v + Delta;
    # theta -= lr (Delta + mu v), the first v being Delta itself.
    lr, mu, size = 0.7, 0.9, 9
    theta = np.linspace(-1, 1, size, dtype=F32)
    params, state = theta.copy(), {"momentum": np.zeros(size, F32)}
    rule, scratch = DiLoCoRule(lr=lr, momentum=mu), np.empty(size, F32)
    velocity = np.zeros(size)
    expected = theta.astype(np.float64)
    for deltas in _rounds(3, 5, size):
        rule.commit(params, state, sum(deltas), len(deltas), scratch)
        mean = sum(d.astype(np.float64) for d in deltas) / len(deltas)
        velocity = mu * velocity + mean
        expected = expected - lr * (mean + mu * velocity)
    assert params.dtype == F32 and state["momentum"].dtype == F32
    np.testing.assert_allclose(params, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state["momentum"], velocity, rtol=1e-5, atol=1e-6)


def test_the_outer_step_matches_torch_sgd_with_nesterov_and_no_dampening() -> None:
    size = 7
    reference = torch.nn.Parameter(torch.linspace(-1, 1, size))
    optimizer = torch.optim.SGD([reference], lr=0.7, momentum=0.9, nesterov=True)
    params, state = reference.detach().numpy().copy(), {"momentum": np.zeros(size, F32)}
    rule, scratch = DiLoCoRule(lr=0.7, momentum=0.9), np.empty(size, F32)
    for deltas in _rounds(2, 4, size):
        reference.grad = torch.from_numpy((deltas[0] + deltas[1]) / 2)
        optimizer.step()
        rule.commit(params, state, deltas[0] + deltas[1], 2, scratch)
    np.testing.assert_allclose(params, reference.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_without_momentum_at_lr_1_a_round_sets_the_parameters_to_the_workers_mean() -> None:
    start = np.array([1.0, 2.0, 3.0], F32)
    workers = [np.array([0.0, 2.0, 5.0], F32), np.array([2.0, 4.0, 7.0], F32)]
    params, scratch = start.copy(), np.empty(3, F32)
    rule = DiLoCoRule(lr=1.0, momentum=0.0)
    assert rule.state_names == ()
    rule.commit(params, {}, sum(start - w for w in workers), 2, scratch)
    np.testing.assert_array_equal(params, [1.0, 3.0, 6.0])


def test_buffer_keys_take_the_workers_mean_with_no_outer_step_or_momentum() -> None:
    # BatchNorm statistics start the period at the servers' values; each worker pushes
    # start - now for them too, and the round leaves their mean, whatever lr and momentum say.
    start = np.array([0.5, 1.0], F32)
    workers = [np.array([0.7, 0.8], F32), np.array([0.9, 1.6], F32)]
    buffers, state = start.copy(), {"momentum": np.full(2, 9.0, F32)}
    rule = DiLoCoRule(lr=0.7, momentum=0.9)
    rule.commit_buffers(buffers, state, sum(start - w for w in workers), 2, np.empty(2, F32))
    np.testing.assert_allclose(buffers, [0.8, 1.2], rtol=1e-6)
    np.testing.assert_array_equal(state["momentum"], [9.0, 9.0])  # untouched


def test_the_momentum_buffer_is_rule_state_so_it_is_replicated_and_checkpointed() -> None:
    rule = make_update_rule(RunConfig(strategy="diloco", outer_lr=0.5, outer_momentum=0.8))
    assert rule == DiLoCoRule(lr=0.5, momentum=0.8)
    assert rule.state_names == ("momentum",) and not rule.replies


def test_diloco_defaults_to_the_papers_outer_optimizer() -> None:
    config = make_config({"strategy": "diloco"})
    assert (config.outer_lr, config.outer_momentum) == (0.7, 0.9)


def test_diloco_takes_a_fixed_tau_or_auto_but_not_the_loss_trigger() -> None:
    assert make_config({"strategy": "diloco", "tau": "auto"}).tau_policy == "auto"
    with pytest.raises(ConfigError) as raised:
        make_config({"strategy": "diloco", "tau": "loss"})
    assert str(raised.value) == (
        "tau loss applies to strategy easgd-async, and auto to diloco: diloco's workers"
        " exchange in rounds of one period, which rank 0 names under auto, and a loss trigger"
        " is each worker's own; use --tau auto or an integer"
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"fragments": 0}, "fragments must be an integer >= 1, got 0"),
        (
            {"strategy": "easgd", "fragments": 2, "servers": 2},
            "fragments applies to strategy diloco only; got 2 with strategy 'easgd'",
        ),
        (
            {"strategy": "diloco", "fragments": 2, "servers": 3},
            "fragments must divide servers; got fragments 2 with servers 3",
        ),
        (
            {"strategy": "diloco", "fragments": 3, "servers": 3, "tau": 100},
            "fragments must divide tau; got fragments 3 with tau 100",
        ),
    ],
)
def test_fragments_are_shard_groups_synced_a_whole_stagger_apart(fields, message) -> None:
    with pytest.raises(ConfigError) as raised:
        make_config(fields)
    assert str(raised.value) == message


def test_fragments_take_the_default_tau_of_diloco() -> None:
    config = make_config({"strategy": "diloco", "fragments": 4, "servers": 4})
    assert (config.tau, config.fragments) == (200, 4)
