"""A run's configuration in the parts each layer reads: which fields are whose, and the one
part that leaves the launcher's process by itself, the servers' (a parameter server is
handed ServerSettings alone, never the whole RunConfig)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ember.config.run import RunConfig, StrategyNamed

# Every field of RunConfig in exactly one part (tests/unit/test_config_parts.py holds it so).
PARTS: dict[str, tuple[str, ...]] = {
    "data": ("data", "seed", "synthetic_samples", "synthetic_features", "data_mode",
             "shuffle_buffer"),
    "training": ("model", "loss", "metrics", "epochs", "batch_size", "lr", "momentum",
                 "nesterov", "optimizer", "optimizer_args", "weight_decay", "scheduler",
                 "warmup_steps", "clip_grad_norm", "precision", "device", "threads"),
    "strategy": ("strategy", "workers", "tau", "tau_policy", "alpha", "outer_lr",
                 "outer_momentum", "fragments", "staleness", "n_push", "n_fetch", "compress"),
    "servers": ("servers", "replicas", "replica_seconds", "worker_timeout", "max_workers",
                "request_timeout", "encrypt", "checkpoint_seconds", "checkpoint_steps",
                "keep_checkpoints"),
    "engine": ("engine", "master", "bind_address", "advertise_address", "ports", "out",
               "resume", "max_restarts", "log_every", "eval_every", "eval_deferred",
               "tensorboard", "mlflow"),
}  # fmt: skip


def part_of(name: str) -> str:
    """The part field `name` belongs to."""
    for part, names in PARTS.items():
        if name in names:
            return part
    raise KeyError(name)


@dataclass(frozen=True)
class ServerSettings(StrategyNamed):
    """What a parameter server reads of a run: its update rule (the optimizer by name with
    its schedule, easgd's moving rate, diloco's outer step), its consistency, the workers it
    expects and its bounds. Of the training part it takes only what its rule needs."""

    strategy: str
    workers: int
    staleness: int
    optimizer: str
    lr: float
    momentum: float
    weight_decay: float
    scheduler: str
    warmup_steps: int
    effective_alpha: float  # easgd's moving rate, resolved from alpha and the workers
    outer_lr: float
    outer_momentum: float
    worker_timeout: float
    max_workers: int | None
    replica_seconds: float
    encrypt: bool
    optimizer_args: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, config: RunConfig) -> ServerSettings:
        taken = {f.name for f in dataclasses.fields(cls)} - {"effective_alpha"}
        values = {name: getattr(config, name) for name in taken}
        return cls(effective_alpha=config.effective_alpha, **values)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ServerSettings:
        """Settings as to_dict wrote them; a field missing or unknown is an error naming it."""
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
