"""What a resumed run keeps of the configuration its checkpoint saved, and what it may change."""

from __future__ import annotations

from typing import Any

from ember.config.membership import worker_range
from ember.config.run import FIELD_NAMES, RunConfig
from ember.errors import CheckpointError, ConfigError

# Fields a resumed run may set anew: they change how it runs and is recorded, not what it
# computes (epochs extends it). out and resume name this invocation and are never inherited.
RESUME_MAY_CHANGE = (
    "epochs",
    "master",
    "bind_address",
    "advertise_address",
    "ports",
    "threads",
    "device",
    "checkpoint_seconds",
    "checkpoint_steps",
    "keep_checkpoints",
    "replicas",
    "replica_seconds",
    "max_restarts",
    "worker_timeout",
    "max_workers",
    "request_timeout",
    "encrypt",
    "wire_cipher",
    "wire_lanes",
    "log_every",
    "eval_every",
    "eval_deferred",
    "metrics",
    "tensorboard",
    "report",
    "mlflow",
    "out",
    "resume",
)


def resumed_values(
    saved: object, explicit: dict[str, Any], where: str
) -> tuple[dict[str, Any], list[str]]:
    """The fields of a run resumed from checkpoint `where`: its saved configuration, with the
    explicit fields over it, and a note "name old -> new" per field that changed. An explicit
    field outside RESUME_MAY_CHANGE that differs from the saved one is a ConfigError; a saved
    configuration that is no valid RunConfig (a user's file) is a CheckpointError."""
    if not isinstance(saved, dict):
        raise CheckpointError(
            f"checkpoint {where}: its manifest's config must be a mapping of field: value,"
            f" got {type(saved).__name__}"
        )
    # Fields this version does not know are ignored; any it added since are explicit or default.
    values = {k: v for k, v in saved.items() if k in FIELD_NAMES and k not in ("out", "resume")}
    try:
        RunConfig(**values).validate()
    except ConfigError as exc:
        raise CheckpointError(
            f"checkpoint {where}: its manifest's config is invalid: {exc}"
        ) from None
    if "workers" in explicit:  # a range as given (`2:3`) against the saved MIN and MAX
        low, high = worker_range(explicit["workers"], explicit.get("workers_max"))
        explicit = {**explicit, "workers": low, **({"workers_max": high} if high else {})}
    notes: list[tuple[str, Any, Any]] = []
    fixed: list[tuple[str, Any, Any]] = []
    for name, given in explicit.items():
        if name in values and given != values[name]:
            (notes if name in RESUME_MAY_CHANGE else fixed).append((name, values[name], given))
        if name not in values or name in RESUME_MAY_CHANGE:
            values[name] = given
    if fixed:
        was = " and ".join(f"{name} was {old!r}" for name, old, _ in fixed)
        got = " and ".join(repr(new) for _, _, new in fixed)
        # tau_policy is set by `--tau auto|loss`, the flag a user types for it
        names = ["tau" if name == "tau_policy" else name for name, _, _ in fixed]
        flags = " and ".join("--" + name.replace("_", "-") for name in names)
        raise ConfigError(f"resume: {was} in {where}, got {got}; drop {flags} or start a new --out")
    return values, [f"{name} {old!r} -> {new!r}" for name, old, new in notes]
