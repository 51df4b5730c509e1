"""Worker 0 evaluates easgd's center in place of its own parameters, and gets its own back."""

from __future__ import annotations

import numpy as np
import torch

from ember.algorithms import FlatModel
from ember.worker.evaluation import evaluate, evaluate_with


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def test_the_center_is_evaluated_and_the_workers_own_parameters_come_back() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 4)).astype(np.float32)
    y = rng.integers(0, 3, 200).astype(np.int64)
    worker, center_model = FlatModel(_model(0)), FlatModel(_model(1))
    own = worker.params_np.copy()
    expected = evaluate(center_model.module, x, y)
    assert expected != evaluate(worker.module, x, y)  # the two models tell apart
    assert evaluate_with(worker, center_model.params_np, x, y) == expected
    np.testing.assert_array_equal(worker.params_np, own)
    assert worker.module[0].weight.data_ptr() == worker.params.data_ptr()  # still the flat view
