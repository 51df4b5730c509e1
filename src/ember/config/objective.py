"""What a run minimizes and reports: the loss by name, the kind of targets it takes, and the
metrics of its held-out set. The torch side is in ember.losses.

imports: errors (under config only objects.py, a leaf: the server process reads it without torch)
"""

from __future__ import annotations

from ember.config.objects import OBJECT_PREFIX
from ember.errors import ConfigError

# Each named loss, and what its targets are: "classes" (integer class indices, the model's
# last dimension holding the logits, per row or per token), "values" (floats of the model's
# output shape, or a column for a one-wide output) or "binary" (floats in [0, 1], logits).
LOSS_TARGETS = {
    "cross_entropy": "classes",
    "mse": "values",
    "l1": "values",
    "huber": "values",
    "bce_with_logits": "binary",
}
LOSSES = tuple(LOSS_TARGETS)
METRICS = ("accuracy", "rmse", "mae", "r2")
VALUE_METRICS = ("rmse", "mae", "r2")  # of targets that are values
DEFAULT_METRICS = {"classes": ("accuracy",), "binary": ("accuracy",), "values": ("rmse", "r2")}
APPLIES = {"classes": ("accuracy",), "binary": METRICS, "values": VALUE_METRICS}


def targets_of(loss: str) -> str | None:
    """What the targets of `loss` are, or None for a user's loss (which decides itself)."""
    return LOSS_TARGETS.get(loss)


def metric_names(loss: str, metrics: str | None) -> tuple[str, ...]:
    """The metrics a run reports besides test_loss: those named, else the loss's own."""
    if metrics is None:
        kind = targets_of(loss)
        return DEFAULT_METRICS[kind] if kind is not None else ()
    return tuple(name.strip() for name in metrics.split(",") if name.strip())


def is_function_name(name: str) -> bool:
    """Whether `name` looks like package.module:function."""
    module, _, attr = name.partition(":")
    parts = [*module.split("."), *attr.split(".")]
    return bool(module and attr) and all(p.isidentifier() for p in parts)


def check_objective(loss: str, metrics: str | None) -> None:
    """One clear error, before anything starts, for a loss or metric ember cannot name."""
    if not isinstance(loss, str) or not (
        loss in LOSSES or loss.startswith(OBJECT_PREFIX) or is_function_name(loss)
    ):
        raise ConfigError(
            f"loss must be one of {', '.join(LOSSES)} or package.module:function, got {loss!r}"
        )
    if metrics is None:
        return
    names = metric_names(loss, metrics)
    for name in names:
        known = name in METRICS or name.startswith(OBJECT_PREFIX) or is_function_name(name)
        if not known:
            raise ConfigError(
                f"metrics: {name!r} is not a metric; use {', '.join(METRICS)} or"
                " package.module:function, separated by commas"
            )
    kind = targets_of(loss)
    for name in names:
        if (name == "accuracy" and kind == "values") or (
            name in VALUE_METRICS and kind == "classes"
        ):
            raise ConfigError(
                f"metrics: {name!r} does not apply to loss {loss!r}, whose targets are {kind};"
                f" its metrics are {', '.join(APPLIES[kind])}"
            )
    if len(set(names)) != len(names):
        raise ConfigError(f"metrics names a metric twice: {metrics!r}")
