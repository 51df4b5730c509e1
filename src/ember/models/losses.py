"""The loss a run minimizes, as a function (output, target) -> scalar tensor: a named one
(objective.py says what targets each takes), a user's `package.module:function`, or a callable
or nn.Module handed to ember.fit; and the one check, before anything starts, that the model's
output fits the targets."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ember.errors import ConfigError
from ember.objective import OBJECT_PREFIX, targets_of

LossFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
NAMED: dict[str, LossFunction] = {
    "cross_entropy": F.cross_entropy,
    "mse": F.mse_loss,
    "l1": F.l1_loss,
    "huber": F.huber_loss,
    "bce_with_logits": F.binary_cross_entropy_with_logits,
}
IGNORE_INDEX = -100  # cross-entropy's: a class target of this value is not counted
_OBJECTS: dict[str, Any] = {}  # losses and metrics handed over as objects, by label


def object_label(kind: str, source: object) -> str:
    """The label a loss or metric object travels under in the run's configuration."""
    name = getattr(source, "__qualname__", None) or type(source).__qualname__
    return f"{OBJECT_PREFIX}{kind}:{getattr(source, '__module__', '?')}.{name}"


def register_object(label: str, source: object) -> None:
    _OBJECTS[label] = source


def registered_objects(labels: list[str]) -> dict[str, Any]:
    """The objects among `labels` this process holds (for an engine to ship to its workers)."""
    return {label: _OBJECTS[label] for label in labels if label in _OBJECTS}


def resolve_function(name: str, what: str) -> Callable[..., Any]:
    """The callable a loss or metric names: a registered object or package.module:function."""
    if name in _OBJECTS:
        return _OBJECTS[name]
    if name.startswith(OBJECT_PREFIX):
        raise ConfigError(
            f"{what} {name!r} was a Python object, which this process was not handed: pass it"
            " to ember.fit again"
        )
    module_name, _, attr = name.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except Exception as exc:  # an import error or the user's module raising at its top level
        raise ConfigError(
            f"{what} {name!r} cannot be imported: {type(exc).__name__}: {exc}"
        ) from exc
    if not callable(target):
        raise ConfigError(f"{what} {name!r} is not callable (it is a {type(target).__name__})")
    return target


def make_loss(name: str) -> LossFunction:
    """The run's loss, taking the model's output and the batch's targets as they come:
    class targets per token (output (batch, tokens, classes)) are flattened for
    cross-entropy, a one-wide output meets one value per row, and integer targets of a
    loss on values are made floats."""
    kind = targets_of(name)
    function = NAMED[name] if kind is not None else resolve_function(name, "loss")

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        output, target = fit_to_targets(kind, output, target)
        return function(output, target)

    return loss


def fit_to_targets(
    kind: str | None, output: torch.Tensor, target: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Output and targets shaped as a named loss of targets `kind` takes them."""
    if kind == "classes":
        if output.dim() > 2 and target.dim() == output.dim() - 1:  # per token: logits last
            return output.reshape(-1, output.shape[-1]), target.reshape(-1)
        return output, target
    if kind in ("values", "binary"):
        if output.dim() == target.dim() + 1 and output.shape[-1] == 1:
            output = output.squeeze(-1)
        return output, target if target.is_floating_point() else target.to(output.dtype)
    return output, target


def forward(model: torch.nn.Module, inputs: Any) -> torch.Tensor:
    """The model on a batch: several inputs (a dict) as keyword arguments."""
    if isinstance(inputs, dict):
        return model(**inputs)
    return model(inputs)
