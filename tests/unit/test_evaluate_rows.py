"""`ember evaluate` scores the rows a user means and says which rows it scored."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ember.api import evaluate_checkpoint
from ember.checkpoint import save_checkpoint
from ember.cli import main

# 50 rows of 3 features: the first 45 are class 0, the last 5 class 1
X = np.arange(150, dtype=np.float32).reshape(50, 3) / 150
Y = np.array([0] * 45 + [1] * 5)


def _checkpoint(root: Path, data: Path) -> Path:
    """logreg on 3 features with zero weights: it predicts class 0 for every row."""
    config = {"model": "logreg", "data": str(data), "strategy": "single", "workers": 1}
    return save_checkpoint(root, 1, {"params": np.zeros(3 * 2 + 2, np.float32)}, {"config": config})


def test_a_file_without_a_test_split_is_scored_whole_when_named(tmp_path: Path) -> None:
    np.savez(tmp_path / "new.npz", x=X, y=Y)
    path = _checkpoint(tmp_path / "checkpoints", tmp_path / "new.npz")
    named = evaluate_checkpoint(path, str(tmp_path / "new.npz"))
    assert (named["rows"], named["split"]) == (50, "whole file (it has no test split)")
    assert named["test_accuracy"] == pytest.approx(0.9)
    # as trained: the rows training held out, said as such
    trained = evaluate_checkpoint(path)
    assert (trained["rows"], trained["split"]) == (
        5,
        "last 5 rows, held out in training (no test split)",
    )
    assert trained["test_accuracy"] == 0.0


def test_a_file_with_a_test_split_is_scored_on_it(tmp_path: Path, capsys) -> None:
    np.savez(tmp_path / "split.npz", x_train=X[:40], y_train=Y[:40], x_test=X[40:], y_test=Y[40:])
    path = _checkpoint(tmp_path / "checkpoints", tmp_path / "split.npz")
    assert main(["evaluate", "--checkpoint", str(path), "--data", str(tmp_path / "split.npz")]) == 0
    said = json.loads(capsys.readouterr().out)
    assert (said["rows"], said["split"], said["test_accuracy"]) == (10, "test split", 0.5)
