"""Fold's commits, which work block by block, against the whole-array arithmetic."""

from __future__ import annotations

from collections import Counter

import numpy as np

from ember.algorithms.rules import EASGDRule, SGDRule
from ember.ps.clocks import ClockTable
from ember.ps.fold import Fold
from ember.ps.replies import Replies
from ember.ps.shard import BLOCK, Shard, ShardSpec, UpdateRule

F32 = np.float32
SIZE = 3 * BLOCK + 11  # blocks of a slice, and a short last one


def _fold(rule: UpdateRule, params: np.ndarray) -> tuple[Fold, Shard, Counter[str]]:
    clocks = ClockTable(1, None, 30.0, 30.0)
    shard = Shard(ShardSpec(0, 1, 0, SIZE), params, rule, clocks, synchronous=False)
    return Fold(shard, Replies(shard)), shard, shard.rejected


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


def test_a_block_holding_inf_is_put_back_alone_and_the_blocks_around_it_are_committed() -> None:
    params = np.ones(SIZE, F32)
    fold, shard, rejected = _fold(SGDRule(lr=1.0, momentum=0.5), params)
    fold.chunk(slice(0, SIZE), _read_only(np.ones(SIZE, F32)), None)
    params_before = shard.params.copy()  # 0 everywhere: 1 - 1.0 * 1
    momentum_before = shard.rule_state["momentum"].copy()  # 1 everywhere
    grad = np.ones(SIZE, F32)
    grad[2 * BLOCK + 5] = np.inf  # the first two blocks are committed before it is met
    fold.chunk(slice(0, SIZE), _read_only(grad), None)
    assert rejected["nonfinite"] == 1
    refused = slice(2 * BLOCK, 3 * BLOCK)
    np.testing.assert_array_equal(shard.params[refused], params_before[refused])
    np.testing.assert_array_equal(shard.rule_state["momentum"][refused], momentum_before[refused])
    others = np.ones(SIZE, bool)
    others[refused] = False
    np.testing.assert_array_equal(shard.rule_state["momentum"][others], 1.5)  # 0.5 * 1 + 1
    np.testing.assert_array_equal(shard.params[others], -1.5)


def test_a_block_that_overflows_from_finite_inputs_alone_is_put_back() -> None:
    """Finite pushes can still overflow (3e38 twice): only that block keeps its parameters
    and momentum, the others are committed, and the commit is counted as refused once."""
    params = np.ones(SIZE, F32)
    params[2 * BLOCK + 5] = 3e38
    fold, shard, rejected = _fold(SGDRule(lr=1.0, momentum=0.5), params)
    grad = np.ones(SIZE, F32)
    grad[2 * BLOCK + 5] = -3e38  # finite, but params - grad is not
    with np.errstate(over="ignore"):
        fold.chunk(slice(0, SIZE), _read_only(grad), None)
    assert rejected["nonfinite"] == 1
    overflowed = slice(2 * BLOCK, 3 * BLOCK)
    np.testing.assert_array_equal(shard.params[overflowed], params[overflowed])
    np.testing.assert_array_equal(shard.rule_state["momentum"][overflowed], 0)
    others = np.ones(SIZE, bool)
    others[overflowed] = False
    np.testing.assert_array_equal(shard.params[others], 0)  # 1 - 1.0 * (0.5 * 0 + 1)
    np.testing.assert_array_equal(shard.rule_state["momentum"][others], 1)


def test_a_refused_easgd_block_answers_zero_and_leaves_the_center() -> None:
    fold, shard, rejected = _fold(EASGDRule(alpha=0.5), np.zeros(SIZE, F32))
    out = np.empty(SIZE, F32)
    worker = np.full(SIZE, 2.0, F32)
    fold.chunk(slice(0, SIZE), _read_only(worker.copy()), out)
    np.testing.assert_array_equal(out, 1.0)
    np.testing.assert_array_equal(shard.params, 1.0)
    worker[BLOCK + 2] = np.nan
    fold.chunk(slice(0, SIZE), _read_only(worker), out)
    assert rejected["nonfinite"] == 1
    refused = slice(BLOCK, 2 * BLOCK)
    np.testing.assert_array_equal(out[refused], 0.0)  # x_i -= 0: that block moves nothing
    np.testing.assert_array_equal(shard.params[refused], 1.0)
    others = np.ones(SIZE, bool)
    others[refused] = False
    np.testing.assert_array_equal(out[others], 0.5)  # 0.5 * (2 - 1)
    np.testing.assert_array_equal(shard.params[others], 1.5)


def _fold_with_buffers(
    rule: UpdateRule, params: np.ndarray, first_buffer: int, start: int, synchronous: bool
) -> tuple[Fold, Shard]:
    """A shard of keys [start, start + params.size) of a model whose buffers begin at
    key `first_buffer`."""
    spec = ShardSpec(0, 1, start, start + params.size, buffers_from=first_buffer)
    clocks = ClockTable(2, None, 30.0, 30.0)
    shard = Shard(spec, params, rule, clocks, synchronous=synchronous)
    return Fold(shard, Replies(shard)), shard


def test_a_push_moves_parameters_by_sgd_and_buffer_keys_by_the_changes_pushed() -> None:
    # keys [0, SPLIT) are parameters, the rest buffers; the split falls inside a block
    split, params = BLOCK + 7, np.ones(SIZE, F32)
    fold, shard = _fold_with_buffers(
        SGDRule(lr=0.1, momentum=0.9, rescale=0.5), params, split, 0, False
    )
    pushed = np.full(SIZE, 3.0, F32)
    fold.chunk(slice(0, SIZE), _read_only(pushed), None)
    np.testing.assert_allclose(shard.params[:split], 1 - 0.1 * 0.5 * 3.0, rtol=1e-6)
    # async: a buffer's change is added as a gradient is scaled (1 / workers), no lr
    np.testing.assert_allclose(shard.params[split:], 1 + 0.5 * 3.0, rtol=1e-6)
    assert not shard.rule_state["momentum"][split:].any()  # no optimizer state for buffers


def test_a_synchronous_round_adds_the_workers_mean_change_to_buffer_keys() -> None:
    size, start = 40, 100  # the shard's first key is 100; buffers begin at key 120
    fold, shard = _fold_with_buffers(SGDRule(lr=1.0), np.ones(size, F32), 120, start, True)
    workers = [shard.clocks.register(worker, 0, 0) for worker in (0, 1)]
    for worker, value in zip(workers, (2.0, 6.0), strict=True):
        fold.payload([_read_only(np.full(size, value, F32))], worker, worker_step=1)
    assert shard.round_count == 2 and shard.round_due()  # both folded into clock 0's round
    fold.maybe_commit_round()
    np.testing.assert_allclose(shard.params[:20], 1 - 4.0)  # the mean gradient, lr 1
    np.testing.assert_allclose(shard.params[20:], 1 + 4.0)  # plus the mean change pushed


def test_easgd_moves_buffers_elastically_like_the_parameters() -> None:
    center = np.zeros(SIZE, F32)
    fold, shard = _fold_with_buffers(EASGDRule(alpha=0.25), center, 100, 0, False)
    out = np.empty(SIZE, F32)
    fold.chunk(slice(0, SIZE), _read_only(np.full(SIZE, 4.0, F32)), out)
    np.testing.assert_allclose(shard.params, 1.0)
    np.testing.assert_allclose(out, 1.0)
