"""What every worker-side algorithm shares: its context, its counters and its protocol."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import InitVar, dataclass, field
from typing import Any, Protocol

import torch

from ember.algorithms.flat import FlatModel
from ember.config import RunConfig, RunParts, StrategyPart, TrainingPart
from ember.config.objects import NO_OBJECTS, OBJECT_PREFIX, UserObjects
from ember.config.training import CONSTANT, Schedule
from ember.errors import ConfigError
from ember.models.losses import resolve_function
from ember.ps import ExchangeResult, PSClient
from ember.ps.codec import codec_named


@dataclass
class WorkerContext:
    """Where a worker stands in the run: handed to its algorithm by the worker loop, which
    reads of the run's configuration its strategy part and the servers' request timeout."""

    config: InitVar[RunConfig | RunParts]
    rank: int
    world: int
    servers: list[str] = field(default_factory=list)  # parameter-server addresses
    secret: bytes = b""  # the run's secret, proven to the servers
    incarnation: int = 0  # bumped each time this rank is restarted
    rendezvous: str = ""  # torch.distributed init_method for allreduce
    store: Any = None  # or the torch.distributed Store the engine met in (Spark's tasks)
    exclusive_device: bool = True  # no other worker computes on this one's GPU (allreduce: NCCL)
    strategy: StrategyPart = field(init=False)  # the strategy, its workers and each exchange
    request_timeout: float = field(init=False)  # a server or peer silent this long is an error

    def __post_init__(self, config: RunConfig | RunParts) -> None:
        parts = config if isinstance(config, RunParts) else RunParts.of(config)
        self.strategy, self.request_timeout = parts.strategy, parts.servers.request_timeout

    def client(self, servers: list[str] | None = None, differences: bool = False) -> PSClient:
        """This worker's client of `servers` (default: all of the run's). `differences`: the
        payload is parameters, sent as differences from the servers' mirror (easgd); else
        it is gradient-like (gradients, pseudo-gradients), sent with error feedback."""
        return PSClient(
            self.servers if servers is None else servers,
            self.secret,
            worker=self.rank,
            incarnation=self.incarnation,
            timeout=self.request_timeout,
            compress=codec_named(self.strategy.compress),  # the codec handed to its links
            differences=differences,
        )


@dataclass
class CommStats:
    t_comm: float = 0.0  # seconds spent in exchanges (round trips with servers or peers)
    t_wait: float = 0.0  # of which compute was blocked waiting
    bytes_pushed: int = 0
    bytes_pulled: int = 0
    exchanges: int = 0
    staleness_sum: int = 0
    staleness_max: int = 0
    lanes: int = 1  # the most sockets an exchange was striped over (--wire-lanes)

    def record(self, result: ExchangeResult, blocked: float) -> None:
        self.t_comm += result.seconds
        self.t_wait += blocked
        self.bytes_pushed += result.bytes_pushed
        self.bytes_pulled += result.bytes_pulled
        self.exchanges += 1
        self.staleness_sum += result.staleness
        self.staleness_max = max(self.staleness_max, result.staleness)
        self.lanes = max(self.lanes, result.lanes)

    def as_record(self) -> dict[str, float | int]:
        return {
            "t_comm": self.t_comm,
            "t_wait": self.t_wait,
            "bytes_pushed": self.bytes_pushed,
            "bytes_pulled": self.bytes_pulled,
            "exchanges": self.exchanges,
            "staleness_max": self.staleness_max,
            "staleness_mean": self.staleness_sum / max(1, self.exchanges),
            "lanes": self.lanes,
        }


class Algorithm(Protocol):
    """The part of a training step that differs per strategy; the loop around it does not."""

    stats: CommStats

    def start(self, flat: FlatModel, optimizer: Optimizer | None) -> int:
        """Connect and load the starting parameters; return the local step to resume from."""
        ...

    def after_backward(self, step: int) -> None:
        """Gradients of step `step` are in flat.grads: update the parameters."""
        ...

    def finish(self) -> None:
        """Apply anything in flight, leave the servers or process group, release sockets."""
        ...


class Optimizer(Protocol):
    """What an algorithm asks of the local optimizer (MomentumSGD, or any torch.optim one)."""

    def step(self) -> Any: ...


class MomentumSGD:
    """The local optimizer: torch.optim.SGD's update with momentum, Nesterov and weight decay
    (no dampening), the same arithmetic in the same order, so the same parameters step for
    step. Not torch.optim.SGD itself: its first use imports torch._dynamo, seconds of every
    worker's start for a compiler a worker never runs."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float,
        momentum: float,
        nesterov: bool,
        weight_decay: float = 0.0,
    ) -> None:
        self.params = list(params)
        self.lr, self.momentum, self.nesterov = lr, momentum, nesterov
        self.weight_decay = weight_decay
        self.buffers: list[torch.Tensor | None] = [None] * len(self.params)
        self.param_groups = [{"lr": lr}]  # where a schedule sets the learning rate

    @torch.no_grad()
    def step(self) -> None:
        self.lr = self.param_groups[0]["lr"]
        for i, param in enumerate(self.params):
            if param.grad is None:
                continue
            direction = param.grad
            if self.weight_decay:
                direction = direction.add(param, alpha=self.weight_decay)
            if self.momentum != 0:
                buffer = self.buffers[i]
                if buffer is None:
                    buffer = self.buffers[i] = direction.detach().clone()
                else:
                    buffer.mul_(self.momentum).add_(direction)
                nesterov = self.nesterov
                direction = direction.add(buffer, alpha=self.momentum) if nesterov else buffer
            param.add_(direction, alpha=-self.lr)


class ScheduledOptimizer:
    """A worker's optimizer as the run configures it: the gradient clipped to clip_grad_norm,
    each group's learning rate set from the schedule (a factor of the group's own starting
    rate), then the optimizer's own step, then a user's schedule object's. `steps` is the
    local steps taken so far (a resumed worker's start)."""

    def __init__(
        self,
        optimizer: Any,
        params: list[torch.nn.Parameter],
        schedule: Schedule,
        clip_grad_norm: float | None,
        scheduler: Any = None,
    ) -> None:
        self.optimizer, self.params = optimizer, params
        self.schedule, self.clip, self.scheduler = schedule, clip_grad_norm, scheduler
        self.rates = [group["lr"] for group in optimizer.param_groups]
        self.steps = 0

    def resume_at(self, steps: int) -> None:
        """Go on from `steps` of the schedule: a resumed worker's own, or a joiner's run's. A
        schedule object handed to the run is stepped there too, as it would have been."""
        self.steps = steps
        if self.scheduler is not None:
            with warnings.catch_warnings():  # "scheduler.step() before optimizer.step()"
                warnings.simplefilter("ignore", UserWarning)
                for _ in range(steps):
                    self.scheduler.step()

    def step(self) -> None:
        if self.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        if self.scheduler is None:
            factor = self.schedule.factor(self.steps)
            for group, rate in zip(self.optimizer.param_groups, self.rates, strict=True):
                group["lr"] = rate * factor
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.steps += 1


def local_optimizer(
    model: torch.nn.Module,
    training: TrainingPart | RunConfig,
    total_steps: int = 0,
    objects: UserObjects = NO_OBJECTS,
) -> Optimizer:
    """The worker's optimizer: momentum SGD ("sgd"), the torch.optim class the run names
    (case-insensitively), or what an optimizer object handed to ember.fit builds from the
    parameters; with the run's weight decay, schedule (or schedule object) and clipping.
    `objects` holds the optimizer and schedule objects the run was handed."""
    config = training if isinstance(training, TrainingPart) else TrainingPart.of(training)
    params = [p for p in model.parameters() if p.requires_grad]
    name, lr, decay = config.optimizer.lower(), config.lr, config.weight_decay
    optimizer: Any
    if name.startswith(OBJECT_PREFIX):
        optimizer = resolve_function(config.optimizer, "optimizer", objects)(params)
    elif name == "sgd":
        optimizer = MomentumSGD(params, lr, config.momentum, config.nesterov, decay)
    else:
        classes: dict[str, Any] = {
            cls.__name__.lower(): cls
            for cls in vars(torch.optim).values()
            if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)
        }
        if name not in classes:
            known = ", ".join(sorted(c for c in classes if c != "optimizer"))
            raise ConfigError(
                f"optimizer must be sgd or a torch.optim class ({known}); got {name!r}"
            )
        try:
            optimizer = classes[name](params, lr=lr, weight_decay=decay, **config.optimizer_args)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"optimizer {config.optimizer!r}: {exc}") from exc
    scheduler = None
    if config.scheduler.startswith(OBJECT_PREFIX):
        scheduler = resolve_function(config.scheduler, "scheduler", objects)(optimizer)
    schedule = (
        Schedule(config.scheduler, total_steps, config.warmup_steps) if not scheduler else CONSTANT
    )
    if schedule == CONSTANT and config.clip_grad_norm is None and scheduler is None:
        return optimizer  # nothing to add around it: today's hot path as it was
    return ScheduledOptimizer(optimizer, params, schedule, config.clip_grad_norm, scheduler)
