"""What every engine does around training: the run directory, resume, the final evaluation."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ember import __version__
from ember.algorithms import flatten_parameters, load_flat_parameters
from ember.checkpoint import Checkpoint, latest_valid_checkpoint, list_checkpoints, load_checkpoint
from ember.config import RunConfig
from ember.data import Dataset
from ember.engines.servers import ServerGroup
from ember.errors import CheckpointError, ConfigError
from ember.metrics import MetricsLog, write_json
from ember.worker import evaluate, load_data, make_model


@dataclass
class RunResult:
    """What `ember.fit` returns: the summary written to summary.json and the trained model."""

    summary: dict[str, Any]
    model: torch.nn.Module
    run_dir: Path


@dataclass
class RunSetup:
    config: RunConfig
    run_dir: Path
    dataset: Dataset
    model: torch.nn.Module
    initial: np.ndarray  # flat starting parameters (fresh, or the checkpoint's)
    resume: Checkpoint | None
    metrics: MetricsLog
    secret: bytes = field(default_factory=lambda: os.urandom(32))  # proves membership of the run

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"

    def server_group(self) -> ServerGroup:
        """This run's parameter servers, not started yet."""
        logs = self.run_dir / "logs"
        return ServerGroup(self.config, self.initial, self.secret, logs, self.resume)

    @property
    def resumed_step(self) -> int:
        return int(self.resume.meta.get("step", 0)) if self.resume is not None else 0


def prepare_run(config: RunConfig, dataset: Dataset | None = None) -> RunSetup:
    """Load data (unless given, e.g. a DataFrame's test rows) and model, resolve --resume, and
    open the run directory (never clobbering one)."""
    dataset = dataset if dataset is not None else load_data(config)
    model = make_model(config, dataset)
    run_dir = config.run_dir()
    checkpoints = run_dir / "checkpoints"
    resume = _resolve_resume(config, checkpoints)
    if resume is None and list_checkpoints(checkpoints):
        raise ConfigError(
            f"out {run_dir} already holds checkpoints; pass --resume auto to continue"
            " that run or choose another --out"
        )
    initial = flatten_parameters(model)
    if resume is not None:
        params = resume.tensors.get("params")
        if params is None or params.shape != initial.shape:
            found = "no params" if params is None else f"{params.size} parameters"
            raise CheckpointError(
                f"checkpoint {resume.path} holds {found}; model {config.model!r}"
                f" on {config.data!r} needs {initial.size}"
            )
        initial = params.astype(np.float32, copy=False)
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    metrics = MetricsLog(run_dir / "metrics.jsonl", tensorboard=config.tensorboard)
    metrics.write(
        {
            "kind": "run",
            "event": "resume" if resume else "start",
            "checkpoint": str(resume.path) if resume else None,
            "config": config.to_dict(),
        }
    )
    return RunSetup(config, run_dir, dataset, model, initial, resume, metrics)


def _resolve_resume(config: RunConfig, checkpoints: Path) -> Checkpoint | None:
    if config.resume is None:
        return None
    if config.resume == "auto":
        return latest_valid_checkpoint(checkpoints)
    path = Path(config.resume)
    if not path.exists():
        raise ConfigError(f"resume must be 'auto' or an existing checkpoint path; got {path}")
    return load_checkpoint(path)


def finish_run(
    setup: RunSetup,
    params: np.ndarray,
    workers: list[dict[str, Any]],
    seconds: float,
    extra: dict[str, Any],
) -> RunResult:
    """Evaluate the final parameters on the held-out set and write summary.json."""
    from ember.metrics import summarize_workers

    config, dataset = setup.config, setup.dataset
    load_flat_parameters(setup.model, params)
    accuracy, loss = evaluate(setup.model, dataset.x_test, dataset.y_test)
    summary = {
        "strategy": config.strategy,
        "engine": config.engine,
        "workers": config.workers,
        "servers": config.servers if config.uses_server else 0,
        "epochs": config.epochs,
        "model": config.model,
        "data": config.data,
        "parameters": int(params.size),
        "test_accuracy": accuracy,
        "test_loss": loss,
        **summarize_workers(workers, seconds),
        "resumed_from": str(setup.resume.path) if setup.resume else None,
        "ember_version": __version__,
        **extra,
        "config": config.to_dict(),
    }
    write_json(setup.run_dir / "summary.json", summary)
    setup.metrics.write({"kind": "summary", "test_accuracy": accuracy, "test_loss": loss})
    setup.metrics.close()
    return RunResult(summary, setup.model, setup.run_dir)
