"""Reference models (mlp, logreg, lenet, cnn_bn) and user model factories, built by name
(imports torch)."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from ember.config.objects import OBJECT_PREFIX
from ember.errors import ConfigError

Shape = tuple[int, ...]


def check_model_object(source: object) -> None:
    """One clear error for a model= that is neither a name nor what builds a model."""
    if not isinstance(source, nn.Module) and not callable(source):
        raise ConfigError(
            "model must be a name, package.module:function, an nn.Module or a callable"
            f" returning one; got {type(source).__name__}"
        )


@dataclass(frozen=True)
class Probe:
    """How a freshly built user model is tried before anything starts: on two rows of zeros of
    the data's dtype (a structured dtype: several inputs), and the shape each output row
    must have (objective.expected_output; None: the loss alone decides)."""

    dtype: np.dtype
    output: tuple[int, ...] | None
    classes: bool = True  # the last output dimension holds logits: at least that many


LOGITS = "logits"  # the probe of float inputs and (num_classes,) logits per row


def build_model(
    spec: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    seed: int = 0,
    probe: Probe | str | None = LOGITS,
    source: object = None,
) -> nn.Module:
    """Build model `spec` for inputs of `input_shape` and `num_classes` outputs per row.

    `spec` is a name in MODEL_NAMES or a factory "package.module:function", called with
    input_shape= and num_classes= when its signature takes them. Parameters are initialized from
    `seed` without touching torch's global RNG, so equal seeds give equal parameters. A user's
    model is tried on `probe`'s rows (None: not tried, for a model rebuilt from a run).
    `source` is the model object `spec` labels, when the run was handed one (UserObjects).
    """
    input_shape = tuple(int(d) for d in input_shape)
    if probe == LOGITS:
        probe = Probe(np.dtype(np.float32), (num_classes,))
    if isinstance(probe, Probe):
        probe = dataclasses.replace(probe, dtype=np.dtype((probe.dtype, input_shape)))
    if (not input_shape and spec in _BUILTINS) or (input_shape and min(input_shape) < 1):
        raise ConfigError(f"input_shape must be one or more sizes >= 1, got {input_shape}")
    if num_classes < 1:
        raise ConfigError(f"num_classes must be >= 1, got {num_classes}")
    if source is not None:
        return _probed(spec, _from_object(spec, source, input_shape, num_classes, seed), probe)
    if spec.startswith(OBJECT_PREFIX):
        raise ConfigError(
            f"model {spec!r} was a Python object, which this process was not handed: pass the"
            " same module (or a function building it) as model="
        )
    builtin = _BUILTINS.get(spec)
    if builtin is None and ":" not in spec:
        raise ConfigError(
            f"model must be one of {', '.join(MODEL_NAMES)} or package.module:function;"
            f" got {spec!r}"
        )
    # forked so seeding here leaves the caller's RNG stream (data shuffling, dropout) untouched
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        if builtin is not None:
            return builtin(input_shape, num_classes)
        return _probed(spec, _from_factory(spec, input_shape, num_classes), probe)


def _probed(spec: str, model: nn.Module, probe: Probe | str | None) -> nn.Module:
    if isinstance(probe, Probe):
        _check_output(spec, model, probe)
    return model


def _mlp(input_shape: Shape, num_classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(math.prod(input_shape), 256),
        nn.ReLU(),
        nn.Linear(256, 256),
        nn.ReLU(),
        nn.Linear(256, num_classes),
    )


def _logreg(input_shape: Shape, num_classes: int) -> nn.Module:
    # softmax over num_classes logits; with 2 classes this is binary logistic regression
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


def _lenet(input_shape: Shape, num_classes: int) -> nn.Module:
    if len(input_shape) != 3:
        raise ConfigError(
            f"model 'lenet' needs image input (C, H, W); data has input shape {input_shape}"
        )
    features = [
        nn.Conv2d(input_shape[0], 6, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
    ]
    try:
        # 16*5*5 for 28x28 input; a dummy forward gets it for any size without the arithmetic
        with torch.no_grad():
            flat = nn.Sequential(*features)(torch.zeros(1, *input_shape)).shape[1]
    except RuntimeError as exc:
        raise ConfigError(
            f"model 'lenet' needs images of at least 12x12; data has input shape {input_shape}"
        ) from exc
    return nn.Sequential(
        *features,
        nn.Linear(flat, 120),
        nn.ReLU(),
        nn.Linear(120, 84),
        nn.ReLU(),
        nn.Linear(84, num_classes),
    )


def _cnn_bn(input_shape: Shape, num_classes: int) -> nn.Module:
    """Two convolutions with BatchNorm, then a hidden layer: a model whose buffers (running
    statistics) travel and decide its accuracy, 103,066 parameters for 28x28 images."""
    if len(input_shape) != 3 or min(input_shape[1:]) < 4:
        raise ConfigError(
            f"model 'cnn_bn' needs images (C, H, W) of at least 4x4; data has input shape"
            f" {input_shape}"
        )
    channels, height, width = input_shape
    return nn.Sequential(
        nn.Conv2d(channels, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * (height // 4) * (width // 4), 128),
        nn.ReLU(),
        nn.Linear(128, num_classes),
    )


_BUILTINS: dict[str, Callable[[Shape, int], nn.Module]] = {
    "mlp": _mlp,
    "logreg": _logreg,
    "lenet": _lenet,
    "cnn_bn": _cnn_bn,
}
MODEL_NAMES = tuple(_BUILTINS)


def _from_object(
    label: str, source: object, input_shape: Shape, num_classes: int, seed: int
) -> nn.Module:
    """A copy of a module object (its own initial parameters), or what a callable builds
    under `seed` (as a factory is called)."""
    if isinstance(source, nn.Module):
        model = copy.deepcopy(source)
    elif callable(source):
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            try:
                model = source(**accepted_kwargs(source, input_shape, num_classes))
            except Exception as exc:
                raise ConfigError(f"model {label!r} raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(model, nn.Module):
            raise ConfigError(
                f"model {label!r} must return a torch.nn.Module, got {type(model).__name__}"
            )
    else:
        raise ConfigError(f"model {label!r} is neither an nn.Module nor callable")
    return model


def _from_factory(spec: str, input_shape: Shape, num_classes: int) -> nn.Module:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"model factory {spec!r} must look like package.module:function")
    where = _import_from_working_directory()
    try:
        target: object = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not _is_prefix(exc.name, module_name):
            raise ConfigError(f"model factory {spec!r} cannot be imported: {exc}") from exc
        path = exc.name.replace(".", "/")
        raise ConfigError(
            f"model factory {spec!r} cannot be imported: {exc}; looked in {where}; check that"
            f" {path}/ or {path}.py is in one of them, on every worker's machine"
        ) from exc
    except ImportError as exc:
        raise ConfigError(f"model factory {spec!r} cannot be imported: {exc}") from exc
    except Exception as exc:  # the user's module raised while running its top level
        raise ConfigError(
            f"model factory {spec!r} cannot be imported: {type(exc).__name__}: {exc}"
        ) from exc
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ConfigError(
                f"model factory {spec!r}: module {module_name!r} has no attribute {attr!r}"
            )
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(
            f"model factory {spec!r} is not callable (it is a {type(target).__name__})"
        )
    try:
        model = target(**accepted_kwargs(target, input_shape, num_classes))
    except Exception as exc:
        raise ConfigError(f"model factory {spec!r} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"model factory {spec!r} must return a torch.nn.Module, got {type(model).__name__}"
        )
    return model


def _import_from_working_directory() -> str:
    """Put the working directory first on the import path, as `python -m` does (a console
    script gets its bin folder instead, and spawned workers inherit the working directory);
    return where imports look, for an error message."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    pythonpath = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    folders = f"PYTHONPATH ({', '.join(pythonpath)})" if pythonpath else "PYTHONPATH (unset)"
    return f"the working directory {cwd}, then {folders} and the installed packages"


def _is_prefix(name: str, module_name: str) -> bool:
    """Whether `name` is `module_name` or a package it is in (not a module it imports)."""
    return (module_name + ".").startswith(name + ".")


def accepted_kwargs(
    factory: Callable[..., object], input_shape: Shape, num_classes: int
) -> dict[str, object]:
    offered: dict[str, object] = {"input_shape": input_shape, "num_classes": num_classes}
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # some builtins and C extensions have no signature
        return {}
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return offered
    by_name = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {k: v for k, v in offered.items() if k in params and params[k].kind in by_name}


def forward(model: torch.nn.Module, inputs: Any) -> torch.Tensor:
    """The model on a batch: several inputs (a dict) as keyword arguments."""
    if isinstance(inputs, dict):
        return model(**inputs)
    return model(inputs)


def _check_output(spec: str, model: nn.Module, probe: Probe) -> None:
    """Fail now, naming the factory, rather than inside the loss on a worker later."""
    from ember.data.batches import model_inputs

    rows = np.zeros(2, dtype=probe.dtype)  # (2, *input_shape), or structured
    inputs = model_inputs(rows)
    shown = (2, *probe.dtype.shape) if probe.dtype.names is None else probe.dtype.names
    first = next(model.parameters(), None)
    if first is not None and first.is_floating_point() and probe.dtype.kind == "f":
        inputs = inputs.to(first.dtype)  # type: ignore[union-attr]
    # eval mode so batch-norm running statistics are not moved by the probe; modes restored after
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            out = forward(model, inputs)
    except Exception as exc:
        raise ConfigError(
            f"model factory {spec!r} fails on input of shape {shown}: {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        for module, training in modes:
            module.training = training
    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    if probe.output is not None and not fits(shape, probe.output, probe.classes):
        what = "logits" if probe.classes else "values"
        raise ConfigError(
            f"model factory {spec!r} must output {what} of shape (batch, {_dims(probe.output)});"
            f" got {shape} for input of shape {shown}"
        )


def fits(shape: object, expected: tuple[int, ...], classes: bool) -> bool:
    """Whether a probe's output shape is (2, *expected): logits of at least the classes the
    targets hold (a model may know more), or a one-wide output for one value per row."""
    if not isinstance(shape, tuple) or not shape or shape[0] != 2:
        return False
    if classes:
        return len(shape) == len(expected) + 1 and (
            shape[1:-1] == expected[:-1] and shape[-1] >= expected[-1]
        )
    return shape[1:] == expected or (expected == () and shape[1:] == (1,))


def _dims(shape: tuple[int, ...]) -> str:
    return ", ".join(str(d) for d in shape) if shape else "1"
