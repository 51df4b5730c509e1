"""The Python API: `ember.fit(...)` takes the CLI's fields and returns summary and model."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

from ember.config import RunConfig, explicit_fields, resumed_values
from ember.errors import ConfigError


def fit(config_file: str | None = None, show_progress: bool = False, **fields: Any) -> Any:
    """Train with the same fields as `ember train` (e.g. model="mlp", strategy="bsp",
    workers=4); returns a RunResult with `.summary`, `.model` and `.run_dir`."""
    from ember.engines import train

    config = run_config({k.replace("-", "_"): v for k, v in fields.items()}, config_file)
    return train(config, show_progress)


def run_config(overrides: dict[str, Any], config_file: str | None = None) -> RunConfig:
    """`make_config`, except that a run resumed from a checkpoint keeps the configuration
    saved with it: explicit fields may change only what `resumed_values` allows."""
    from ember.engines.run import _resolve_resume

    explicit = explicit_fields(overrides, config_file)
    if explicit.get("resume") is None:
        return RunConfig(**explicit).validate()
    probe = RunConfig(out=explicit.get("out"), resume=explicit["resume"]).validate()
    with warnings.catch_warnings():  # prepare_run looks again and warns of a bad checkpoint
        warnings.simplefilter("ignore")
        checkpoint = _resolve_resume(probe, probe.run_dir() / "checkpoints")
    if checkpoint is None:  # --resume auto in a run directory without checkpoints: start afresh
        return RunConfig(**explicit).validate()
    values, changed = resumed_values(checkpoint.meta.get("config"), explicit, str(checkpoint.path))
    config = RunConfig(**values).validate()
    if changed:
        print(f"ember: resuming from {checkpoint.path}: {', '.join(changed)}", file=sys.stderr)
    return config


def evaluate_checkpoint(
    checkpoint: str | Path, data: str | None = None, model: str | None = None
) -> dict[str, Any]:
    """Load a checkpoint (a step directory or a run's checkpoints folder) and score its
    parameters on the test split of `data` (default: the data it was trained on).

    A checkpoint is a user's file: a model factory it names is imported only when the caller
    names the same factory in `model`, never on the file's word alone."""
    from ember.algorithms import load_flat_parameters
    from ember.checkpoint import load_checkpoint
    from ember.errors import CheckpointError
    from ember.models import MODEL_NAMES
    from ember.worker import evaluate, load_data, make_model

    loaded = load_checkpoint(Path(checkpoint))
    saved = dict(loaded.meta.get("config", {}))
    config = RunConfig(**{k: v for k, v in saved.items() if k in RunConfig.__dataclass_fields__})
    if data is not None:
        config.data = data
    if model is not None:
        config.model = model
    elif config.model not in MODEL_NAMES:
        raise ConfigError(
            f"checkpoint {loaded.path} was trained with model factory {config.model!r}; pass "
            f"--model {config.model} to import and run it"
        )
    dataset = load_data(config)
    network = make_model(config, dataset)
    params = loaded.tensors.get("params")
    expected = sum(p.numel() for p in network.parameters())
    if params is None or params.size != expected:
        raise CheckpointError(
            f"checkpoint {loaded.path}: holds "
            f"{'no params' if params is None else f'{params.size} parameters'}"
            f", model {config.model!r} on {config.data!r} needs {expected}"
        )
    load_flat_parameters(network, params)
    accuracy, loss = evaluate(network, dataset.x_test, dataset.y_test)
    return {
        "checkpoint": str(loaded.path),
        "data": config.data,
        "model": config.model,
        "test_accuracy": accuracy,
        "test_loss": loss,
        "step": loaded.step,
    }
