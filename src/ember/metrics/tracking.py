"""MLflow tracking of a training job: one MLflow run per job, logged from the driver. mlflow
is imported lazily: it is an optional extra (ember[mlflow])."""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from ember.errors import ConfigError
from ember.metrics.records import Evaluation, Record

Result = TypeVar("Result")
# The summary's figures logged as the run's final metrics, besides test_loss and test_<metric>
FINAL = (
    "train_seconds",
    "wall_seconds",
    "samples_per_second",
    "bytes_pushed",
    "bytes_pulled",
    "exchanges",
)
ARTIFACTS = "ember"  # the MLflow artifact folder of the run's model files, summary and metrics
MODEL = "model"  # the name the model is logged under in MLflow's pytorch flavor
_jobs: list[MlflowJob] = []  # the job being trained in this process, if MLflow tracks it


def wanted(mlflow: bool | None) -> bool:
    """Whether to track a job: `mlflow` True or False says so; None tracks when the caller
    has an MLflow run active (which means mlflow is imported already: nothing is imported
    to find out)."""
    if mlflow is False:
        return False
    if mlflow:
        try:
            import mlflow as _  # noqa: F401
        except ImportError:
            raise ConfigError(
                "mlflow=True needs the mlflow package: pip install 'ember[mlflow]'"
            ) from None
        return True
    module = sys.modules.get("mlflow")
    return module is not None and module.active_run() is not None


def tracked(mlflow: bool | None, config: Any, train: Callable[[], Result]) -> Result:
    """`train()`, logged to one MLflow run when `wanted(mlflow)`: `config`'s fields as params
    first, worker 0's epoch evaluations as they reach the driver (`record`), then the
    summary's figures, the run's files and the model. With a run already active, the job's
    run is its child, so that every fit of a tuning search gets one of its own. `mlflow`
    None takes the configuration's `mlflow` field (`--mlflow`) when it is set."""
    if mlflow is None and getattr(config, "mlflow", False):
        mlflow = True
    if not wanted(mlflow):
        return train()
    import mlflow as ml

    with ml.start_run(nested=ml.active_run() is not None) as active:
        job = MlflowJob(active.info.run_id)
        ml.log_params(_params(config.to_dict()))
        _jobs.append(job)
        try:
            result = train()
        finally:
            _jobs.remove(job)
        job.finish(result)
    return result


def record(received: Record) -> None:
    """A record the driver received from a worker: worker 0's evaluation at an epoch's end
    goes to the tracked job as `epoch/test_loss`, `epoch/test_<metric>`, at step = epoch."""
    if _jobs and isinstance(received, Evaluation) and received.epoch_end:
        _jobs[-1].log_epoch(received.scores, received.epoch)


class MlflowJob:
    """The MLflow run of one training job; a failure to log warns once and stops the logging
    of metrics, never the training."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._broken = False

    def log_epoch(self, scores: Mapping[str, Any], epoch: int) -> None:
        import mlflow

        if self._broken:
            return
        logged = {f"epoch/{k}": float(v) for k, v in scores.items() if _is_score(k, v)}
        try:
            mlflow.log_metrics(logged, step=epoch, run_id=self.run_id)
        except Exception as exc:  # a tracking server that went away must not end the run
            self._broken = True
            warnings.warn(
                f"MLflow: cannot log epoch metrics ({exc}); training goes on", stacklevel=2
            )

    def finish(self, result: Any) -> None:
        """The summary's figures as metrics, the run's files under `ember/`, and the model in
        MLflow's pytorch flavor (torch.export's pt2 format, batch size free). The run id and
        model URI go into summary.json's `mlflow`."""
        import mlflow

        summary, run_dir = result.summary, Path(result.run_dir)
        final = {k: float(v) for k, v in summary.items() if _is_score(k, v) or k in FINAL}
        mlflow.log_metrics(final, run_id=self.run_id)
        mlflow.set_tag("ember.run_dir", str(run_dir.resolve()))
        for name in ("model.safetensors", "model.json", "summary.json", "metrics.jsonl"):
            if (run_dir / name).is_file():
                mlflow.log_artifact(str(run_dir / name), ARTIFACTS, run_id=self.run_id)
        logged = {"run_id": self.run_id, "model_uri": self._log_model(result)}
        summary["mlflow"] = logged
        summary_file = run_dir / "summary.json"
        if summary_file.is_file():
            from ember.metrics import write_json

            write_json(summary_file, summary)

    def _log_model(self, result: Any) -> str | None:
        import mlflow.pytorch
        import numpy as np
        import torch

        # two rows: torch.export keeps a batch dimension of one example row fixed at 1
        example = np.zeros((2, *result.shape[0]), np.float32)
        try:
            info = mlflow.pytorch.log_model(
                result.model,
                name=MODEL,
                input_example=example,
                pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
            )
        except Exception as exc:  # torch.export cannot trace every model
            warnings.warn(
                f"MLflow: the model cannot be logged in the pytorch flavor ({exc}); its"
                f" model.safetensors and model.json are the run's artifacts under {ARTIFACTS}/",
                stacklevel=2,
            )
            return None
        return str(info.model_uri)


def _is_score(key: str, value: Any) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return number and key.startswith("test_")


def _params(fields: Mapping[str, Any]) -> dict[str, str]:
    """A run's fields as MLflow params: strings, a nested value as JSON."""
    return {
        key: json.dumps(value) if isinstance(value, (dict, list)) else str(value)
        for key, value in fields.items()
    }
