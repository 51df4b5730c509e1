"""`ember.fit` trains on arrays the caller holds: an (x, y) pair of NumPy arrays or CPU
tensors, with or without a test pair of its own."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import ember
from ember.errors import ConfigError
from ember.metrics import read_records
from ember.metrics.records import Evaluation

pytestmark = pytest.mark.timeout(120)


def _separable(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 8)).astype(np.float32)
    return x, (x[:, 0] - x[:, 3] > 0).astype(np.int64)


def test_fit_trains_on_arrays_and_tensors_and_scores_the_test_pair_given(tmp_path: Path) -> None:
    x, y = _separable(4000, 0)
    x_test, y_test = _separable(600, 1)
    result = ember.fit(
        data=(torch.from_numpy(x), y),
        test_data=(x_test, torch.from_numpy(y_test)),
        model="mlp",
        strategy="bsp",
        epochs=2,
        out=str(tmp_path / "run"),
    )
    assert result.summary["data"] == "arrays"
    assert result.summary["test_accuracy"] >= 0.95
    with torch.no_grad():
        predicted = result.model(torch.from_numpy(x_test)).argmax(dim=1).numpy()
    assert (predicted == y_test).mean() == result.summary["test_accuracy"]


def test_without_a_test_pair_the_last_tenth_is_held_out(tmp_path: Path) -> None:
    x, y = _separable(2000, 2)
    result = ember.fit(
        data=(x, y), model="logreg", strategy="single", epochs=1, out=str(tmp_path / "run")
    )
    with torch.no_grad():
        predicted = result.model(torch.from_numpy(x[1800:])).argmax(dim=1).numpy()
    assert (predicted == y[1800:]).mean() == result.summary["test_accuracy"]


def test_arrays_that_cannot_train_are_one_error_naming_them(tmp_path: Path) -> None:
    x, y = _separable(100, 3)
    with pytest.raises(ConfigError) as refused:
        ember.fit(data=(x,), out=str(tmp_path / "a"))
    assert str(refused.value) == (
        "data must be a path, a dataset name, an (x, y) pair of arrays or a map-style torch"
        " Dataset; got tuple"
    )
    with pytest.raises(ConfigError, match="data's x has 100 rows but data's y has 99"):
        ember.fit(data=(x, y[:99]), out=str(tmp_path / "b"))
    with pytest.raises(ConfigError, match="test_data goes with data given as arrays"):
        ember.fit(data="digits", test_data=(x, y), out=str(tmp_path / "c"))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


class OwnCrossEntropy(torch.nn.Module):
    """A user's loss object: ember cannot know from its name what its targets are."""

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(output, target)


def test_a_loss_object_on_class_targets_reports_accuracy_too(tmp_path: Path) -> None:
    """Integer targets and a score per class say it is a classifier: the summary and every
    epoch's evaluation have test_accuracy, as with a named loss."""
    x, y = _separable(4000, 3)
    x_test, y_test = _separable(600, 4)
    result = ember.fit(
        data=(x, y),
        test_data=(x_test, y_test),
        model="mlp",
        loss=OwnCrossEntropy(),
        strategy="easgd-async",
        workers=2,
        epochs=2,
        out=str(tmp_path / "run"),
    )
    assert result.summary["test_accuracy"] >= 0.95
    with torch.no_grad():
        predicted = result.model(torch.from_numpy(x_test)).argmax(dim=1).numpy()
    assert (predicted == y_test).mean() == result.summary["test_accuracy"]
    records = read_records(result.run_dir / "metrics.jsonl")
    epochs = [record for record in records if isinstance(record, Evaluation)]
    assert epochs and all("test_accuracy" in record.scores for record in epochs)
