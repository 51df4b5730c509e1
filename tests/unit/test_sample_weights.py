"""Sample weights: the weighted loss, the batches that carry them, and the checks on them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ember.config.objects import UserObjects
from ember.data import Dataset
from ember.data.arrow import partition_arrays
from ember.data.batches import MemoryBatches
from ember.errors import ConfigError
from ember.models.losses import make_loss, torch_targets


def test_a_weighted_loss_is_the_batch_mean_of_weight_times_row_loss() -> None:
    torch.manual_seed(0)
    output, target = torch.randn(6, 3), torch.tensor([0, 1, 2, 0, 1, 2])
    weights = torch.tensor([0.5, 1.0, 2.0, 0.0, 3.0, 1.5])
    loss = make_loss("cross_entropy")
    rows = F.cross_entropy(output, target, reduction="none")
    torch.testing.assert_close(loss(output, target, weights), (rows * weights).mean())
    # all weights 1: the unweighted mean, as without weights
    torch.testing.assert_close(loss(output, target, torch.ones(6)), loss(output, target))


def test_rows_of_several_values_weigh_their_mean() -> None:
    output, target = torch.randn(4, 3), torch.randn(4, 3)
    weights = torch.tensor([1.0, 0.0, 2.0, 1.0])
    per_row = ((output - target) ** 2).mean(dim=1)
    got = make_loss("mse")(output, target, weights)
    torch.testing.assert_close(got, (per_row * weights).mean())


def test_a_row_of_weight_zero_gives_no_gradient() -> None:
    model = nn.Linear(2, 2)
    x, y = torch.randn(2, 2), torch.tensor([0, 1])
    make_loss("cross_entropy")(model(x), y, torch.tensor([1.0, 0.0])).backward()
    only_first = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    (F.cross_entropy(model(x[:1]), y[:1]) / 2).backward()
    for got, want in zip(only_first, [p.grad for p in model.parameters()], strict=True):
        torch.testing.assert_close(got, want)


def test_torchs_own_losses_handed_as_objects_take_a_weight_and_their_targets_shape() -> None:
    output = torch.sigmoid(torch.randn(4, 1))
    target = torch.tensor([0.0, 1.0, 1.0, 0.0])  # one value a row, as a label column holds
    weights = torch.tensor([0.1, 0.2, 0.3, 0.4])
    want = (F.binary_cross_entropy(output[:, 0], target, reduction="none") * weights).mean()
    for handed in (F.binary_cross_entropy, nn.BCELoss()):
        objects = UserObjects(functions={"object:loss:bce": handed})
        loss = make_loss("object:loss:bce", objects)
        torch.testing.assert_close(loss(output, target, weights), want)
        torch.testing.assert_close(
            loss(output, target), F.binary_cross_entropy(output[:, 0], target)
        )
    assert torch_targets(nn.CrossEntropyLoss()) == "classes"
    assert torch_targets(F.mse_loss) == "values"
    assert torch_targets(lambda output, target: output.sum()) is None


def test_a_users_loss_without_reduction_is_one_clear_error_under_weights() -> None:
    objects = UserObjects(functions={"object:loss:mine": lambda output, target: output.mean()})
    loss = make_loss("object:loss:mine", objects)
    assert loss(torch.ones(2, 2), torch.ones(2)).item() == 1.0  # unweighted: as it comes
    with pytest.raises(ConfigError, match="must take reduction='none'"):
        loss(torch.ones(2, 2), torch.ones(2), torch.ones(2))


def test_memory_batches_carry_each_rows_weight_beside_it() -> None:
    rows = 12
    x = np.arange(rows, dtype=np.float32).reshape(rows, 1)
    y = np.arange(rows, dtype=np.int64)
    w = np.arange(rows, dtype=np.float32) / 10
    batches = list(MemoryBatches(x, y, 4, seed=1, rank=0, weights=w).epoch(0))
    assert len(batches) == 3 and all(len(b) == 3 for b in batches)
    for inputs, targets, weights in batches:
        torch.testing.assert_close(weights, targets.float() / 10)
        torch.testing.assert_close(inputs[:, 0], targets.float())
    assert all(len(b) == 2 for b in MemoryBatches(x, y, 4, seed=1, rank=0).epoch(0))


def test_a_partitions_weight_column_becomes_float32_weights() -> None:
    table = pa.table(
        {
            "features": pa.array([[1.0, 2.0], [3.0, 4.0]], pa.list_(pa.float32())),
            "label": pa.array([0, 1], pa.int64()),
            "weight": pa.array([0.5, 2.0], pa.float32()),
        }
    )
    w = partition_arrays(table.to_batches(), (2,))[2]
    assert w is not None and w.dtype == np.float32
    np.testing.assert_array_equal(w, [0.5, 2.0])
    assert partition_arrays(table.drop(["weight"]).to_batches(), (2,))[2] is None


@pytest.mark.parametrize("bad", [[1.0, -1.0, 1.0], [1.0, np.nan, 1.0], [1.0, 1.0]])
def test_a_datasets_weights_must_be_finite_nonnegative_and_one_a_row(bad: list[float]) -> None:
    x = np.zeros((3, 2), np.float32)
    y = np.zeros(3, np.int64)
    with pytest.raises(ConfigError, match="weights"):
        Dataset("w", x, y, x, y, 2, (2,), w_train=np.array(bad, np.float32))
