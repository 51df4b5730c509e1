"""MLflow tracking: one MLflow run per training job, with the run's fields, worker 0's epoch
evaluations and the model, which mlflow.pytorch and ember both load back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ember
from ember.errors import ConfigError
from tests.processes import SRC

mlflow = pytest.importorskip("mlflow", reason="pip install -e '.[mlflow]' (in dev too)")
pytestmark = pytest.mark.timeout(300)  # the model's torch.export takes a while


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A local file store in tmp_path, and an experiment of its own."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow 3 asks for a database
    mlflow.set_tracking_uri((tmp_path / "mlruns").as_uri())
    mlflow.set_experiment("ember-tests")
    yield mlflow.MlflowClient()
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(None)


def _separable(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 8)).astype(np.float32)
    return x, (x[:, 0] - x[:, 3] > 0).astype(np.int64)


def test_a_fit_logs_one_mlflow_run_with_params_epoch_metrics_and_a_loadable_model(
    store, tmp_path
) -> None:
    x, y = _separable(4000, 0)
    result = ember.fit(
        data=(x, y), model="mlp", strategy="bsp", workers=2, epochs=2, mlflow=True,
        out=str(tmp_path / "run"),
    )  # fmt: skip
    logged = result.summary["mlflow"]
    runs = store.search_runs([mlflow.get_experiment_by_name("ember-tests").experiment_id])
    assert [r.info.run_id for r in runs] == [logged["run_id"]]  # one run, not one per worker
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.params["strategy"] == "bsp" and run.data.params["workers"] == "2"
    assert run.data.metrics["test_accuracy"] == pytest.approx(result.summary["test_accuracy"])
    epochs = store.get_metric_history(run.info.run_id, "epoch/test_accuracy")
    assert [m.step for m in epochs] == [1, 2]
    # the model, from MLflow's pytorch flavor and from the safetensors beside it
    x_test = torch.from_numpy(x[3600:])
    with torch.no_grad():
        expected = result.model(x_test)
        assert torch.allclose(mlflow.pytorch.load_model(logged["model_uri"])(x_test), expected)
        files = mlflow.artifacts.download_artifacts(
            run_id=run.info.run_id, artifact_path="ember", dst_path=str(tmp_path / "got")
        )
        assert torch.equal(ember.load(files)(x_test), expected)


def test_an_active_run_gets_a_child_run_per_fit_and_mlflow_false_logs_nothing(
    store, tmp_path
) -> None:
    x, y = _separable(2000, 1)
    fields = {"model": "logreg", "strategy": "single", "epochs": 1}
    with mlflow.start_run() as parent:
        first = ember.fit(data=(x, y), out=str(tmp_path / "a"), **fields)
        ember.fit(data=(x, y), out=str(tmp_path / "b"), mlflow=False, **fields)
        assert mlflow.active_run().info.run_id == parent.info.run_id
    children = store.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    assert [r.info.run_id for r in children] == [first.summary["mlflow"]["run_id"]]


def test_mlflow_true_without_mlflow_installed_is_one_clear_error(monkeypatch, tmp_path) -> None:
    monkeypatch.setitem(__import__("sys").modules, "mlflow", None)  # import mlflow fails
    with pytest.raises(ConfigError, match=r"mlflow=True needs the mlflow package: pip install"):
        ember.fit(data=_separable(500, 2), strategy="single", mlflow=True, out=str(tmp_path))


def test_the_cli_logs_a_run_to_the_tracking_uri_with_the_mlflow_flag(tmp_path, monkeypatch) -> None:
    store = tmp_path / "mlruns"
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # for this process's client too
    env = {  # none of this process's MLflow settings (an experiment another test chose)
        **{key: value for key, value in os.environ.items() if not key.startswith("MLFLOW_")},
        "PYTHONPATH": os.pathsep.join([SRC, *filter(None, [os.environ.get("PYTHONPATH")])]),
        "MLFLOW_TRACKING_URI": store.as_uri(),
        "MLFLOW_ALLOW_FILE_STORE": "true",  # mlflow 3 asks for a database
    }
    argv = [sys.executable, "-m", "ember", "train", "--data", "digits", "--model", "logreg"]
    argv += ["--strategy", "bsp", "--workers", "2", "--epochs", "1", "--mlflow"]
    done = subprocess.run(
        [*argv, "--out", str(tmp_path / "run")], env=env, capture_output=True, text=True,
        timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["config"]["mlflow"] is True
    client = mlflow.MlflowClient(tracking_uri=store.as_uri())
    experiments = client.search_experiments()
    runs = client.search_runs([e.experiment_id for e in experiments])
    assert [r.info.run_id for r in runs] == [summary["mlflow"]["run_id"]]
    run = runs[0]
    assert run.info.status == "FINISHED" and run.data.params["strategy"] == "bsp"
    assert run.data.metrics["test_accuracy"] == pytest.approx(summary["test_accuracy"])
    # without the flag, nothing is logged
    done = subprocess.run(
        [*argv[:-1], "--out", str(tmp_path / "plain")], env=env, capture_output=True, text=True,
        timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert len(client.search_runs([e.experiment_id for e in experiments])) == 1
    assert "mlflow" not in json.loads((tmp_path / "plain" / "summary.json").read_text())
