"""What `ember train` says when a run cannot succeed or goes wrong: at once, once, and in
files that stay strict JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ember

pytestmark = pytest.mark.timeout(120)
SRC = str(Path(ember.__file__).resolve().parents[1])
MODELS = """
    import math
    import multiprocessing

    from torch import nn


    class PoisonFromStep3(nn.Module):
        # training logits turn NaN from the third step on: a model that diverges
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x):
            if not self.training:
                return x
            self.calls += 1
            return x * float("nan") if self.calls >= 3 else x


    def diverging(input_shape, num_classes):
        linear = nn.Linear(math.prod(input_shape), num_classes)
        return nn.Sequential(nn.Flatten(), linear, PoisonFromStep3())


    def only_in_the_launcher(input_shape, num_classes):
        if multiprocessing.current_process().name.startswith("ember-worker"):
            raise ImportError("cannot import name 'kernels' from 'fastlib'")
        return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))
"""


def _train(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (folder / "usermodels.py").write_text(textwrap.dedent(MODELS))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-m", "ember", "train", "--out", str(folder / "run"), *args],
        cwd=folder,
        env={**env, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        timeout=100,
    )


def _strict(text: str) -> Any:
    """JSON as a strict parser reads it: NaN and Infinity are no JSON."""

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_too_few_rows_for_the_workers_is_one_error_before_anything_starts(tmp_path) -> None:
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    np.savez(tmp_path / "tiny.npz", x=x, y=np.array([0, 1, 0, 1]))
    done = _train(tmp_path, "--data", "tiny.npz", "--model", "logreg", "--workers", "5")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "ember: loading data",
        "ember: error: data tiny.npz: 3 training rows (besides 1 test row) cannot give each of"
        " 5 workers one batch of 64 rows (320 rows at least); lower --workers or --batch-size",
    ]
    assert not (tmp_path / "run").exists()  # no server, no worker, no run directory


def test_a_worker_that_cannot_build_its_model_fails_the_run_without_restarts(tmp_path) -> None:
    done = _train(
        tmp_path, "--data", "digits", "--model", "usermodels:only_in_the_launcher", "--epochs", "1"
    )
    assert done.returncode == 1
    assert "restarted (incarnation" not in done.stderr
    failure = done.stderr.split("ember: training failed: ", 1)[1].splitlines()[0]
    assert failure in (
        f"worker {rank} raised (not restarted: it would fail again):" for rank in (0, 1)
    )
    assert "ImportError: cannot import name 'kernels' from 'fastlib'" in done.stderr
    assert done.stderr.count("Traceback (most recent call last)") == 1  # the log's, once
    kinds = [_strict(line)["kind"] for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert "restart" not in kinds and kinds.count("failure") == 1


def test_a_diverging_model_is_said_once_per_worker_and_flagged_in_strict_json(tmp_path) -> None:
    done = _train(tmp_path, "--data", "digits", "--model", "usermodels:diverging", "--epochs", "1")
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert sorted(warnings) == [
        f"ember: warning: worker {rank}'s training loss is nan at step 3 (epoch 1): training has"
        " diverged; a lower --lr usually helps"
        for rank in (0, 1)
    ]
    run = tmp_path / "run"
    summary = _strict((run / "summary.json").read_text())
    assert summary["diverged"] is True
    assert summary["first_non_finite_loss"] == {
        "rank": 0,
        "incarnation": 0,
        "step": 3,
        "epoch": 1,
        "loss": "nan",
    }
    records = [_strict(line) for line in (run / "metrics.jsonl").open()]
    diverged = [(r["rank"], r["step"]) for r in records if r["kind"] == "diverged"]
    assert sorted(diverged) == [(0, 3), (1, 3)]
    assert any(r["kind"] == "worker" and r["loss"] is None for r in records)


def test_a_run_that_converges_says_so(tmp_path) -> None:
    done = _train(tmp_path, "--data", "digits", "--model", "logreg", "--epochs", "1")
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr
    summary = _strict((tmp_path / "run" / "summary.json").read_text())
    assert summary["diverged"] is False and summary["first_non_finite_loss"] is None
