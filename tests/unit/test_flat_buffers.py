"""FlatModel carries a module's buffers beside its parameters: BatchNorm's statistics and count
travel in the flat vector, whatever their dtype, and come back to the module."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from ember.algorithms.flat import (
    FlatModel,
    flat_layout,
    flatten_parameters,
    load_flat_parameters,
    model_buffers,
)
from tests.bn_models import bn_mlp


def _trained_bn(steps: int = 3) -> nn.Module:
    torch.manual_seed(0)
    model = bn_mlp((1, 4, 4), 3)
    for _ in range(steps):
        model(torch.randn(8, 1, 4, 4))
    return model


def test_the_flat_vector_holds_the_parameters_then_every_persistent_buffer() -> None:
    model = _trained_bn()
    flat = FlatModel(model)
    names = [name for name, *_ in model_buffers(model)]
    assert names == [k for k in model.state_dict() if "running" in k or "num_batches" in k]
    assert (flat.param_size, flat.buffer_size) == flat_layout(model)
    assert flat.buffer_size == 2 * (128 + 128 + 1)
    bn = model[2]
    tail = flat.params[flat.param_size :]
    np.testing.assert_array_equal(tail[:128], bn.running_mean)
    np.testing.assert_array_equal(tail[128:256], bn.running_var)
    assert tail[256] == bn.num_batches_tracked.item() == 3


def test_float_buffers_are_views_that_the_module_updates_in_place() -> None:
    model = _trained_bn()
    flat = FlatModel(model)
    before = flat.buffers.clone()
    model(torch.randn(8, 1, 4, 4))  # BatchNorm writes its running statistics in place
    assert not torch.equal(flat.buffers[:128], before[:128])
    np.testing.assert_array_equal(flat.buffers[:128], model[2].running_mean)


def test_an_integer_buffer_is_gathered_into_and_scattered_from_the_flat_vector() -> None:
    model = _trained_bn(steps=2)
    flat = FlatModel(model)
    count_key = flat.param_size + 256
    model(torch.randn(8, 1, 4, 4))
    assert flat.params[count_key] == 2  # an int64 buffer is a copy until gathered
    flat.gather_buffers()
    assert flat.params[count_key] == 3
    flat.params_np[count_key] = 6.6  # an exchange averaged it: it comes back rounded
    flat.scatter_buffers()
    assert model[2].num_batches_tracked.dtype == torch.int64
    assert model[2].num_batches_tracked.item() == 7


def test_a_buffer_the_module_replaces_is_taken_back_into_the_flat_vector() -> None:
    model = nn.BatchNorm1d(4)
    flat = FlatModel(model)
    model.running_mean = torch.full((4,), 2.5)  # a module assigning a new tensor
    flat.gather_buffers()
    np.testing.assert_array_equal(flat.buffers[:4], np.full(4, 2.5, np.float32))
    flat.params_np[flat.param_size] = 9.0
    assert model.running_mean[0] == 9.0  # a view again


def test_a_buffer_that_changes_shape_is_an_error_naming_it() -> None:
    model = nn.BatchNorm1d(4)
    flat = FlatModel(model)
    model.running_mean = torch.zeros(5)
    with pytest.raises(ValueError, match="buffer 'running_mean' changed shape from \\[4\\] to"):
        flat.gather_buffers()


def test_flatten_and_load_round_trip_parameters_and_buffers_of_every_dtype() -> None:
    source, target = _trained_bn(steps=5), bn_mlp((1, 4, 4), 3)
    source.register_buffer("mask", torch.tensor([True, False, True]))
    target.register_buffer("mask", torch.zeros(3, dtype=torch.bool))
    source.register_buffer("scratch", torch.ones(2), persistent=False)
    target.register_buffer("scratch", torch.zeros(2), persistent=False)
    load_flat_parameters(target, flatten_parameters(source))
    got, want = target.state_dict(), source.state_dict()
    assert got.keys() == want.keys()
    for key in want:
        assert got[key].dtype == want[key].dtype
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=0)
    assert target.scratch.sum() == 0  # not persistent: neither saved nor carried


def test_a_flat_state_of_the_wrong_size_is_an_error_giving_both_parts() -> None:
    with pytest.raises(ValueError, match="needs \\(6,\\): 4 parameters and 2 buffer values"):
        load_flat_parameters(_Counted(), np.zeros(4, np.float32))


class _Counted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(4))
        self.register_buffer("seen", torch.zeros(2))
