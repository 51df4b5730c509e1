"""Fold's commits, which work block by block, against the whole-array arithmetic."""

from __future__ import annotations

from collections import Counter

import numpy as np

from ember.algorithms.rules import EASGDRule, SGDRule
from ember.ps.clocks import ClockTable
from ember.ps.fold import BLOCK, Fold
from ember.ps.replies import Replies
from ember.ps.shard import ShardSpec, ShardState, UpdateRule

F32 = np.float32
SIZE = 3 * BLOCK + 11  # blocks of a slice, and a short last one


def _fold(rule: UpdateRule, params: np.ndarray) -> tuple[Fold, ShardState, Counter[str]]:
    spec = ShardSpec(0, 1, 0, SIZE)
    shard = ShardState.create(spec, params, rule.state_names, None, False, 0)
    rejected: Counter[str] = Counter()
    replies = Replies(shard, Counter())
    fold = Fold(shard, rule, ClockTable(1, None, 30.0, 30.0), replies, Counter(), rejected)
    return fold, shard, rejected


def _read_only(values: np.ndarray) -> np.ndarray:
    values.flags.writeable = False  # as a payload is: a view of a receive buffer
    return values


def test_a_commit_across_blocks_moves_every_key_as_sgd_with_momentum_does() -> None:
    rng = np.random.default_rng(0)
    params = rng.normal(size=SIZE).astype(F32)
    fold, shard, rejected = _fold(SGDRule(lr=0.1, momentum=0.9, rescale=0.5), params)
    expected, buf = params.astype(np.float64), np.zeros(SIZE)
    for _ in range(3):
        grad = rng.normal(size=SIZE).astype(F32)
        fold.chunk(slice(0, SIZE), _read_only(grad), None)
        buf = 0.9 * buf + 0.5 * grad
        expected -= 0.1 * buf
    np.testing.assert_allclose(shard.params, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(shard.rule_state["momentum"], buf, rtol=1e-5, atol=1e-6)
    assert not rejected


def test_a_commit_refused_in_a_late_block_puts_back_the_blocks_before_it() -> None:
    params = np.ones(SIZE, F32)
    fold, shard, rejected = _fold(SGDRule(lr=1.0, momentum=0.5), params)
    fold.chunk(slice(0, SIZE), _read_only(np.ones(SIZE, F32)), None)
    params_before = shard.params.copy()
    momentum_before = shard.rule_state["momentum"].copy()
    grad = np.ones(SIZE, F32)
    grad[2 * BLOCK + 5] = np.inf  # the first two blocks are committed before it is met
    fold.chunk(slice(0, SIZE), _read_only(grad), None)
    assert rejected["nonfinite"] == 1
    np.testing.assert_array_equal(shard.params, params_before)
    np.testing.assert_array_equal(shard.rule_state["momentum"], momentum_before)


def test_a_refused_easgd_chunk_answers_zero_and_leaves_the_center() -> None:
    fold, shard, rejected = _fold(EASGDRule(alpha=0.5), np.zeros(SIZE, F32))
    out = np.empty(SIZE, F32)
    worker = np.full(SIZE, 2.0, F32)
    fold.chunk(slice(0, SIZE), _read_only(worker.copy()), out)
    np.testing.assert_array_equal(out, 1.0)
    np.testing.assert_array_equal(shard.params, 1.0)
    worker[BLOCK + 2] = np.nan
    fold.chunk(slice(0, SIZE), _read_only(worker), out)
    assert rejected["nonfinite"] == 1
    np.testing.assert_array_equal(out, 0.0)
    np.testing.assert_array_equal(shard.params, 1.0)
