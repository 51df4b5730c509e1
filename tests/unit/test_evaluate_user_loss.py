"""A user's loss object says nothing of its targets: a classifier's evaluation (integer
targets, a score per class) reports accuracy beside the loss, anything else the loss alone,
and metrics the run names are what it reports."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ember.config.objects import UserObjects, object_label
from ember.worker.evaluation import evaluate


def user_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if target.is_floating_point():
        return F.mse_loss(output.squeeze(-1), target)
    return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


LABEL = object_label("loss", user_loss)
OBJECTS = UserObjects(functions={LABEL: user_loss})
rng = np.random.default_rng(0)
X = rng.standard_normal((300, 4)).astype(np.float32)


def _model(outputs: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, outputs)


def test_class_targets_and_a_score_per_class_report_the_accuracy() -> None:
    y = rng.integers(0, 3, 300).astype(np.int64)
    model = _model(3)
    scores = evaluate(model, X, y, LABEL, None, OBJECTS, batch=64)
    with torch.no_grad():
        output = model(torch.from_numpy(X))
    assert scores["test_accuracy"] == pytest.approx((output.argmax(1).numpy() == y).mean())
    loss = float(user_loss(output, torch.from_numpy(y)))
    assert scores["test_loss"] == pytest.approx(loss, rel=1e-5)


@pytest.mark.parametrize(
    ("outputs", "y"),
    [
        (1, rng.standard_normal(300).astype(np.float32)),  # values
        (1, rng.integers(0, 2, 300).astype(np.int64)),  # one output a row: no class scores
    ],
)
def test_other_targets_report_the_loss_alone(outputs: int, y: np.ndarray) -> None:
    loss = user_loss if y.dtype != np.int64 else (lambda o, t: F.mse_loss(o.squeeze(-1), t.float()))
    label = object_label("loss", loss)
    scores = evaluate(_model(outputs), X, y, label, None, UserObjects(functions={label: loss}))
    assert set(scores) == {"test_loss"}


def first_class_share(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (output.argmax(-1) == 0).float().mean()


def test_metrics_the_run_names_are_what_it_reports() -> None:
    y = rng.integers(0, 3, 300).astype(np.int64)
    metric = object_label("metric", first_class_share)
    objects = UserObjects(functions={LABEL: user_loss, metric: first_class_share})
    scores = evaluate(_model(3), X, y, LABEL, metric, objects)
    assert set(scores) == {"test_loss", "test_first_class_share"}
