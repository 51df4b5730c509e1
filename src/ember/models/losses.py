"""The loss a run minimizes, as a function (output, target) -> scalar tensor: a named one
(config/objective.py says what targets each takes), a user's `package.module:function`, or a
callable or nn.Module handed to ember.fit; and the one check, before anything starts, that the
model's output fits the targets."""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ember.config.objective import targets_of
from ember.config.objects import NO_OBJECTS, OBJECT_PREFIX, UserObjects
from ember.errors import ConfigError
from ember.models.zoo import Probe, forward

LossFunction = Callable[..., torch.Tensor]  # (output, target[, weights]) -> a scalar
NAMED: dict[str, LossFunction] = {
    "cross_entropy": F.cross_entropy,
    "mse": F.mse_loss,
    "l1": F.l1_loss,
    "huber": F.huber_loss,
    "bce_with_logits": F.binary_cross_entropy_with_logits,
}


def resolve_function(name: str, what: str, objects: UserObjects = NO_OBJECTS) -> Callable[..., Any]:
    """The callable a loss, metric, optimizer or schedule names: an object the run was handed
    (in `objects`) or package.module:function; a loss or metric named by its class (an
    nn.Module such as a user's MyCE) is that class built with no arguments."""
    handed = objects.function(name)
    if handed is not None:
        return handed
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
    if isinstance(target, type) and what in ("loss", "metric"):
        try:
            return target()
        except Exception as exc:
            raise ConfigError(
                f"{what} {name!r} is a class that cannot be built without arguments:"
                f" {type(exc).__name__}: {exc}"
            ) from exc
    return target


def make_loss(name: str, objects: UserObjects = NO_OBJECTS) -> LossFunction:
    """The run's loss, taking the model's output and the batch's targets as they come:
    class targets per token (output (batch, tokens, classes)) are flattened for
    cross-entropy, a one-wide output meets one value per row, and integer targets of a
    loss on values are made floats.

    Given the rows' `weights` (a weight column), it is the batch's mean of weight x the
    row's loss, as Horovod's Spark estimator weighs rows: a row's pull on the model is then
    its weight whichever batch it falls in (a weighted average per batch would let a row's
    batch-mates change it), and every strategy averages or applies such batch gradients."""
    kind = targets_of(name)
    function = NAMED[name] if kind is not None else resolve_function(name, "loss", objects)
    kind = kind or torch_targets(function)
    per_row: LossFunction | None = None

    def loss(
        output: torch.Tensor, target: torch.Tensor, weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        nonlocal per_row
        output, target = fit_to_targets(kind, output, target)
        if weights is None:
            return function(output, target)
        per_row = per_row or unreduced(function, name)
        values = per_row(output, target)
        if values.dim() == 0 or values.numel() % len(weights):
            raise ConfigError(
                f"loss {name!r} with reduction='none' gave shape {tuple(values.shape)} for a"
                f" batch of {len(weights)} rows: sample weights need a value per row"
            )
        # one value per row: a row of several targets (tokens, values) is their mean
        rows = values.reshape(len(weights), -1).mean(dim=1)
        return (rows * weights.to(rows.dtype)).mean()

    return loss


# torch's own losses, handed as objects, by the targets they take (config/objective.py's kinds)
TORCH_TARGETS = {
    "classes": ("cross_entropy", "nll_loss", "CrossEntropyLoss", "NLLLoss"),
    "values": (
        *("mse_loss", "l1_loss", "huber_loss", "smooth_l1_loss"),
        *("MSELoss", "L1Loss", "HuberLoss", "SmoothL1Loss"),
    ),
    "binary": (
        *("binary_cross_entropy", "binary_cross_entropy_with_logits"),
        *("BCELoss", "BCEWithLogitsLoss"),
    ),
}


def torch_targets(function: Callable[..., Any]) -> str | None:
    """The targets kind of one of torch's own losses (F.binary_cross_entropy, nn.BCELoss()),
    so its output and targets are shaped as the named losses' are; None for anything else,
    a user's loss taking them as they come."""
    if isinstance(function, torch.nn.Module):
        own = type(function).__module__.startswith("torch.nn.")
        name = type(function).__name__ if own else None
    else:
        own = getattr(function, "__module__", None) == "torch.nn.functional"
        name = getattr(function, "__name__", None) if own else None
    return next((kind for kind, names in TORCH_TARGETS.items() if name in names), None)


def unreduced(function: Callable[..., Any], name: str) -> LossFunction:
    """`function` giving each row's loss, not their mean: an nn.Module's copy with reduction
    "none", or the function called with reduction="none" (as torch's losses take it)."""
    if isinstance(function, torch.nn.Module):
        if not hasattr(function, "reduction"):
            raise ConfigError(
                f"loss {name!r} has no reduction attribute: sample weights need each row's loss"
            )
        module = copy.copy(function)
        setattr(module, "reduction", "none")  # noqa: B010 - a Module's attribute, typed loosely
        return module

    def each_row(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        try:
            return function(output, target, reduction="none")
        except TypeError as exc:
            raise ConfigError(
                f"loss {name!r} must take reduction='none' under sample weights (a weight"
                f" column): the run weighs each row's loss: {exc}"
            ) from exc

    return each_row


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


def data_probe(loss: str, x: np.ndarray, y: np.ndarray, num_classes: int) -> Probe:
    """How a model for these inputs and targets is tried (zoo.Probe): the output each row
    must have for `loss`, which a user's loss decides alone."""
    kind = targets_of(loss)
    dtype = np.dtype(x.dtype)
    if kind == "classes":
        return Probe(dtype, (*y.shape[1:], num_classes))
    if kind is not None:
        return Probe(dtype, tuple(y.shape[1:]), classes=False)
    return Probe(dtype, None)


def check_fit(
    model: torch.nn.Module,
    loss: str,
    x: np.ndarray,
    y: np.ndarray,
    objects: UserObjects = NO_OBJECTS,
) -> None:
    """One clear error, before anything starts, when the loss cannot take the model's output
    on the first rows and their targets, or does not give one number."""
    from ember.data.batches import as_tensor, model_inputs

    function = make_loss(loss, objects)
    modes = [(m, m.training) for m in model.modules()]
    model.eval()  # batch-norm statistics stay as they were
    try:
        with torch.no_grad():
            output = forward(model, model_inputs(x))
            targets = as_tensor(y)
            try:
                value = function(output.float(), targets)
            except Exception as exc:
                raise ConfigError(
                    f"loss {loss!r} does not fit the model's output and the targets: output of"
                    f" shape {tuple(output.shape)}, targets of shape {tuple(targets.shape)}"
                    f" ({targets.dtype}): {type(exc).__name__}: {exc}"
                ) from exc
    finally:
        for module, training in modes:
            module.training = training
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ConfigError(f"loss {loss!r} must return one number (a scalar tensor), got {shape}")
