"""A run's model as plain PyTorch reads it: model.safetensors (a state_dict: parameter and
buffer names to tensors, shapes and dtypes as the module has them) and model.json (how to
build the module again), and `ember.load`, which gives the module back from a run directory
or a checkpoint.

imports: algorithms, checkpoint, config, data, errors, models
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch

from ember.checkpoint import LAST, MANIFEST, Checkpoint, load_checkpoint, verify_run_state
from ember.config import RunConfig
from ember.config.objects import NO_OBJECTS, OBJECT_PREFIX, UserObjects, defined_at
from ember.data.pixels import input_transform
from ember.errors import CheckpointError, ConfigError
from ember.models import MODEL_NAMES, accepted_kwargs, build_model

MODEL_FILE = "model.safetensors"
MODEL_JSON = "model.json"
FORMAT = "ember-model/1"
JSON_LIMIT = 1 << 20  # model.json is a few hundred bytes; more is not ours
ModelSource = str | torch.nn.Module | Callable[..., torch.nn.Module] | None


def save_model(
    run_dir: Path,
    model: torch.nn.Module,
    config: RunConfig,
    shape: tuple[tuple[int, ...], int],
    objects: UserObjects = NO_OBJECTS,
) -> None:
    """Write model.safetensors and model.json into `run_dir`, each atomically; a model the run
    was handed as an object (in `objects`) is named by where it is defined."""
    # Tied weights share storage, which safetensors refuses: each key gets its own copy, so
    # load_state_dict(strict=True) finds every key the module has.
    state = {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
    buffers = {name for name, _ in model.named_buffers()}
    factory = config.model
    source = objects.model_for(factory)
    describe = {
        "format": FORMAT,
        "model": factory,
        "input_shape": list(shape[0]),
        "num_classes": shape[1],
        "seed": config.seed,
        "strategy": config.strategy,
        "data": config.data,
        "state_dict": MODEL_FILE,
        "parameters": [k for k in state if k not in buffers],
        "buffers": [k for k in state if k in buffers],
        "load": (
            f"model = {_rebuild(factory, tuple(shape[0]), shape[1], source)}; model.load_state_"
            f"dict(safetensors.torch.load_file({MODEL_FILE!r}), strict=True); model.eval()"
        ),
        **({"source": defined_at(source)} if source is not None else {}),
        # what raw pixels must go through first (ember predict and EmberModel apply it)
        "input_transform": input_transform(config.data),
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f".{MODEL_FILE}.tmp-{os.getpid()}"
    safetensors.torch.save_file(state, str(tmp), metadata={"format": FORMAT})
    os.replace(tmp, run_dir / MODEL_FILE)
    tmp = run_dir / f".{MODEL_JSON}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(describe, indent=2) + "\n")
    os.replace(tmp, run_dir / MODEL_JSON)


def _rebuild(factory: str, shape: tuple[int, ...], classes: int, source: object = None) -> str:
    """The call that builds the module, as model.json tells a reader (docs/export.md has the
    built-in models in plain PyTorch, for a process without ember): a model object by where
    it is defined, with the arguments ember gave it (an instance: the ones its caller gave,
    which ember never saw)."""
    if factory in MODEL_NAMES:
        return f"ember.models.build_model({factory!r}, {shape}, {classes})"
    if source is not None:
        module, _, name = defined_at(source).partition(":")
        if isinstance(source, torch.nn.Module):
            return f"{module}.{name}(...)  # as you built the instance you handed to ember"
        builder: Any = source
    else:
        module, _, name = factory.partition(":")
        builder = None
    given = {"input_shape": shape, "num_classes": classes}
    if builder is not None:
        given = accepted_kwargs(builder, shape, classes)
    return f"{module}.{name}({', '.join(f'{k}={v!r}' for k, v in given.items())})"


Shape = tuple[tuple[int, ...], int]  # a model's input shape and classes


def load_model(path: str | Path, model: ModelSource = None) -> torch.nn.Module:
    """The trained module of a run directory (its model.safetensors), or of a checkpoint (a
    step directory, a run's checkpoints folder, or a run directory without model.safetensors:
    its newest checkpoint), with parameters and buffers, in eval mode.

    `model` builds the module to load into: a built-in name or "package.module:factory", a
    callable taking input_shape= and num_classes=, or an nn.Module to fill. By default the
    run's own model, except a factory: the files are a user's, so a factory they name is
    imported only when the caller names it too, never on the files' word alone."""
    return load_with_shape(path, model)[0]


def load_with_shape(path: str | Path, model: ModelSource = None) -> tuple[torch.nn.Module, Shape]:
    """load_model, and the input shape and classes the model was built for."""
    path = Path(path).expanduser()
    if (path / MODEL_JSON).is_file() and (path / MODEL_FILE).is_file():
        return _from_export(path, model)
    root = path / "checkpoints" if (path / "checkpoints" / LAST).is_file() else path
    if not (root / LAST).is_file() and not (root / MANIFEST).is_file():
        raise CheckpointError(
            f"{path}: neither a run directory with {MODEL_FILE} and {MODEL_JSON} nor a"
            " checkpoint (a step directory or a checkpoints folder with 'last')"
        )
    return _from_checkpoint(root, model)


def _from_export(run_dir: Path, model: ModelSource) -> tuple[torch.nn.Module, Shape]:
    with open(run_dir / MODEL_JSON, "rb") as f:
        raw = f.read(JSON_LIMIT + 1)
    return _from_parts(
        raw, lambda: safetensors.torch.load_file(str(run_dir / MODEL_FILE)), model, run_dir
    )


def load_bytes(
    described: bytes, weights: bytes, model: ModelSource, where: str | Path
) -> tuple[torch.nn.Module, Shape]:
    """load_with_shape of a model.json and a model.safetensors held in memory (a Spark task's
    copy of a model), `where` naming the folder they came from in errors."""
    return _from_parts(described, lambda: safetensors.torch.load(weights), model, Path(where))


def _from_parts(
    raw: bytes, state_dict: Callable[[], dict[str, torch.Tensor]], model: ModelSource, folder: Path
) -> tuple[torch.nn.Module, Shape]:
    where = folder / MODEL_JSON
    try:
        if len(raw) > JSON_LIMIT:
            raise ValueError(f"larger than {JSON_LIMIT} bytes")
        described = json.loads(raw)
        if not isinstance(described, dict) or described.get("format") != FORMAT:
            raise ValueError(f"format is not {FORMAT!r}")
        factory, classes = described["model"], described["num_classes"]
        shape = tuple(described["input_shape"])
        if not isinstance(factory, str) or not isinstance(classes, int):
            raise ValueError("'model' must be a string and 'num_classes' an integer")
        if not all(isinstance(d, int) and d > 0 for d in shape):
            raise ValueError(f"'input_shape' must be positive integers, got {list(shape)}")
        seed = int(described.get("seed", 0))
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{where}: not an ember model description ({exc})") from None
    module = _build(model, factory, shape, classes, seed, where)
    try:
        state = state_dict()
    except (OSError, safetensors.SafetensorError) as exc:
        raise CheckpointError(f"{folder / MODEL_FILE}: cannot read ({exc})") from None
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(
            f"{folder / MODEL_FILE} does not fit the model built for it: {exc}"
        ) from None
    return module.eval(), (shape, classes)


def _from_checkpoint(root: Path, model: ModelSource) -> tuple[torch.nn.Module, Shape]:

    loaded = verify_run_state(load_checkpoint(root))
    meta, where = loaded.meta, loaded.path / MANIFEST
    factory = meta.get("model")
    if not isinstance(factory, str):
        raise CheckpointError(f"checkpoint {where}: meta.model must be a string, got {factory!r}")
    shape, classes = meta.get("input_shape"), meta.get("num_classes")
    if not isinstance(shape, list) or not isinstance(classes, int):
        shape, classes = _shape_from_data(meta, where)
    module = _build(model, factory, tuple(shape), classes, _seed(meta), where)
    fill_from_checkpoint(module, loaded)
    return module.eval(), (tuple(shape), classes)


def fill_from_checkpoint(module: torch.nn.Module, loaded: Checkpoint) -> None:
    """Load a verified checkpoint's flat state into `module`. One saved before buffers were
    part of the flat state fills the parameters and leaves the buffers as built, warning."""
    from ember.algorithms.flat import flat_layout, flatten_parameters, load_flat_parameters

    params, where = loaded.tensors["params"], loaded.path / MANIFEST
    parameters, buffers = flat_layout(module)
    if params.size == parameters and buffers and "buffers" not in loaded.meta:
        warnings.warn(
            f"checkpoint {where} predates buffers in checkpoints: its parameters are loaded,"
            " the model's buffers (BatchNorm statistics) keep their initial values",
            stacklevel=3,
        )
        params = np.concatenate([params, flatten_parameters(module)[parameters:]])
    try:
        load_flat_parameters(module, params)
    except ValueError as exc:
        raise CheckpointError(f"checkpoint {where}: {exc}") from None


def _shape_from_data(meta: dict[str, Any], where: Path) -> tuple[list[int], int]:
    """A checkpoint from before the shape was saved: ask its data, as it was trained."""
    from ember.data import load_dataset

    data = meta.get("data")
    if not isinstance(data, str):
        raise CheckpointError(f"checkpoint {where}: meta names no data to size the model by")
    dataset = load_dataset(data, seed=_seed(meta))
    return list(dataset.input_shape), dataset.num_classes


def _seed(meta: dict[str, Any]) -> int:
    config = meta.get("config")
    seed = config.get("seed", 0) if isinstance(config, dict) else 0
    return seed if isinstance(seed, int) else 0


def _build(
    model: ModelSource, factory: str, shape: tuple[int, ...], classes: int, seed: int, where: Path
) -> torch.nn.Module:
    if isinstance(model, torch.nn.Module):
        return model
    if callable(model):
        return model(input_shape=shape, num_classes=classes)
    if model is None:
        if factory.startswith(OBJECT_PREFIX):
            raise ConfigError(
                f"{where} was trained with a model object ({factory.removeprefix(OBJECT_PREFIX)});"
                " pass model= the same module, or a function building it (ember predict:"
                " --model module:Name, where it is defined)"
            )
        if factory not in MODEL_NAMES:
            raise ConfigError(
                f"{where} was trained with model factory {factory!r}; pass model={factory!r}"
                f" (--model {factory}) to import and run it"
            )
        model = factory
    return build_model(model, shape, classes, seed=seed, probe=None)
