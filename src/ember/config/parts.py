"""A run's configuration in the parts each layer reads: which fields are whose, and the one
part that leaves the launcher's process by itself, the servers' (a parameter server is
handed ServerSettings alone, never the whole RunConfig)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ember.config.choices import not_one_of
from ember.config.run import RunConfig, StrategyNamed, moving_rate
from ember.config.strategies import Strategy


class Part:
    """One part of a run's configuration: its fields copied out of a validated RunConfig."""

    @classmethod
    def of(cls, config: RunConfig) -> Any:
        names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        return cls(**{name: getattr(config, name) for name in names})


@dataclass(frozen=True)
class DataPart(Part):
    """What the data layer reads: which rows, how they are held, the seed they shuffle by."""

    data: str
    seed: int
    synthetic_samples: int
    synthetic_features: int
    data_mode: str
    shuffle_buffer: int


@dataclass(frozen=True)
class TrainingPart(Part):
    """What a worker's model, loss, optimizer and schedule are, and where it computes."""

    model: str
    loss: str
    metrics: str | None
    epochs: int
    batch_size: int
    lr: float
    momentum: float
    nesterov: bool
    optimizer: str
    optimizer_args: dict[str, Any]
    weight_decay: float
    scheduler: str
    warmup_steps: int
    clip_grad_norm: float | None
    precision: str
    device: str
    threads: int


@dataclass(frozen=True)
class StrategyPart(Part, StrategyNamed):
    """How the workers share their work: the strategy (a Strategy, whatever named it), the
    workers and each exchange."""

    strategy: Strategy
    workers: int
    workers_max: int | None  # a worker range's MAX; None: a fixed run
    tau: int
    tau_policy: str
    alpha: float | None
    outer_lr: float
    outer_momentum: float
    fragments: int
    fragment_sync_delay: int | None
    mixing_alpha: float | None
    staleness: int
    n_push: int
    n_fetch: int
    compress: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "strategy", strategy_named(self.strategy))

    @property
    def effective_alpha(self) -> float:
        """A range's members pull with the rate of its MAX: with every member in, the
        center still moves by at most beta a round."""
        return moving_rate(self.alpha, self.workers_max or self.workers)


@dataclass(frozen=True)
class ServersPart(Part):
    """What the launcher's server group reads: shards, replicas, bounds and checkpoints."""

    servers: int
    replicas: int
    replica_seconds: float
    worker_timeout: float
    max_workers: int | None
    request_timeout: float
    encrypt: bool
    wire_cipher: str
    wire_lanes: str
    checkpoint_seconds: float
    checkpoint_steps: int
    keep_checkpoints: int


@dataclass(frozen=True)
class EnginePart(Part):
    """What an engine and the Run read: where it runs and listens, what it writes, and how
    often it restarts, logs and evaluates."""

    engine: str
    master: str | None
    bind_address: str | None
    advertise_address: str | None
    ports: str | None
    out: str | None
    resume: str | None
    max_restarts: int
    log_every: int
    eval_every: int
    eval_deferred: bool
    tensorboard: bool
    report: bool
    mlflow: bool


@dataclass(frozen=True)
class RunParts:
    """A validated RunConfig parsed once into the parts each layer reads."""

    data: DataPart
    training: TrainingPart
    strategy: StrategyPart
    servers: ServersPart
    engine: EnginePart

    @classmethod
    def of(cls, config: RunConfig) -> RunParts:
        return cls(
            DataPart.of(config),
            TrainingPart.of(config),
            StrategyPart.of(config),
            ServersPart.of(config),
            EnginePart.of(config),
        )

    def value(self, name: str) -> Any:
        """Field `name` from the part that holds it."""
        return getattr(getattr(self, part_of(name)), name)


_CLASSES: dict[str, type[Part]] = {
    "data": DataPart,
    "training": TrainingPart,
    "strategy": StrategyPart,
    "servers": ServersPart,
    "engine": EnginePart,
}
# Every field of RunConfig in exactly one part (tests/unit/test_config_parts.py holds it so).
PARTS: dict[str, tuple[str, ...]] = {
    name: tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
    for name, cls in _CLASSES.items()
}


def strategy_named(name: object) -> Strategy:
    """The Strategy a run's field names: the one place past RunConfig that reads the name."""
    try:
        return Strategy(name)
    except ValueError:
        raise not_one_of("strategy", name, Strategy) from None


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

    strategy: Strategy  # a name in to_dict's values, a Strategy again in from_dict's
    workers: int
    workers_max: int | None  # a worker range's MAX: live members at most
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
    wire_cipher: str
    optimizer_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "strategy", strategy_named(self.strategy))

    @classmethod
    def of(cls, config: RunConfig | RunParts) -> ServerSettings:
        parts = config if isinstance(config, RunParts) else RunParts.of(config)
        taken = {f.name for f in dataclasses.fields(cls)} - {"effective_alpha"}
        values = {name: parts.value(name) for name in taken}
        return cls(effective_alpha=parts.strategy.effective_alpha, **values)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ServerSettings:
        """Settings as to_dict wrote them; a field missing or unknown is an error naming it."""
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "strategy": self.strategy.value}
