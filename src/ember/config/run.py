"""The fields of a run, their defaults and the checks that name the first invalid one."""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ember.config.choices import one_of
from ember.config.devices import check_available, check_device, cuda_count
from ember.config.membership import check_worker_range, worker_range
from ember.config.network import check_host, port_range
from ember.config.objective import check_objective
from ember.config.strategies import STRATEGIES, AlgorithmKind, ConsistencyKind, Strategy
from ember.config.tau import check_tau_policy
from ember.config.training import (
    check_optimizer,
    check_optimizer_args,
    check_precision,
    check_scheduler,
)
from ember.errors import ConfigError

ENGINES = ("local", "spark")
DATA_MODES = ("auto", "memory", "stream")  # see docs/data.md
# The most workers a shard's clock table may hold (ps/clockrows.py's MAX_TABLE_ROWS, what a
# reader of a table accepts): the ceiling of max_workers.
MAX_WORKERS = 1 << 20
# How exchanges travel: the names of ps/codec.py's codecs, which imports no config (a unit
# test keeps the two the same, and MAX_WORKERS equal to the clock table's row bound).
CODECS = ("none", "fp16", "bf16", "int8")
# diloco's tau when none is given: its periods are long (the paper's are 500 inner steps), and
# at easgd's 8 the outer momentum would extrapolate from a few minibatches' change each round
DILOCO_TAU = 200


class StrategyNamed:
    """What a strategy's name implies, for settings that hold it as `strategy`."""

    strategy: str

    @property
    def mode(self) -> Strategy:
        """The strategy as a Strategy, which answers what its name implies."""
        return Strategy(self.strategy)

    @property
    def algorithm(self) -> AlgorithmKind:
        return self.mode.algorithm

    @property
    def consistency(self) -> ConsistencyKind:
        return self.mode.consistency

    @property
    def uses_server(self) -> bool:
        return self.mode.uses_server


def moving_rate(alpha: float | None, workers: int) -> float:
    """easgd's moving rate: alpha, or the paper's beta / p with beta 0.9."""
    return alpha if alpha is not None else 0.9 / workers


@dataclass
class RunConfig(StrategyNamed):
    """Everything a run needs; the CLI flags, the YAML file and `ember.fit` all fill this."""

    data: str = "mnist"  # mnist | digits | synthetic-lr | path to .npz, .parquet or an IDX folder
    model: str = "mlp"  # mlp | logreg | lenet | package.module:factory
    strategy: str = "easgd-async"  # one of STRATEGIES (a Strategy member is taken as its name)
    workers: int = 2  # data-parallel worker processes (a range's MIN: --workers MIN:MAX)
    # a worker range's MAX: members join and leave between workers and this (None: fixed)
    workers_max: int | None = None
    servers: int = 1  # parameter-server processes (key-range shards)
    epochs: int = 5  # passes over the training set (each worker over its shard)
    batch_size: int = 64  # per-worker minibatch
    lr: float = 0.05  # learning rate (server optimizer for sgd, local optimizer otherwise)
    momentum: float = 0.9  # SGD momentum (server-side for sgd, local for easgd/single/allreduce)
    nesterov: bool = False  # Nesterov momentum on the local optimizer (EAMSGD)
    optimizer: str = "sgd"  # sgd | adam | adamw (servers or workers) | any torch.optim name
    weight_decay: float = 0.0  # L2 penalty (sgd, adam) or decoupled decay (adamw)
    scheduler: str = "constant"  # constant | step | cosine | onecycle | linear (training.py)
    warmup_steps: int = 0  # optimizer steps of linear learning-rate warm-up
    clip_grad_norm: float | None = None  # clip each worker's gradient to this L2 norm
    precision: str = "32"  # 32 | bf16-mixed | 16-mixed: the forward pass's (training.py)
    device: str = "auto"  # auto | cpu | cuda | cuda:N: where workers compute (devices.py)
    # cross_entropy | mse | l1 | huber | bce_with_logits | package.module:function (objective.py)
    loss: str = "cross_entropy"
    metrics: str | None = None  # comma-separated: accuracy,rmse,mae,r2; None: the loss's own
    optimizer_args: dict[str, Any] = field(default_factory=dict)  # the optimizer's keywords
    data_mode: str = "auto"  # auto | memory | stream: hold each worker's shard, or stream it
    shuffle_buffer: int = 10_000  # stream: rows mixed in the bounded shuffle buffer
    tau: int = 8  # easgd, diloco: local steps between exchanges (auto/loss: the first)
    tau_policy: str = "fixed"  # fixed | auto | loss (easgd-async): how tau is chosen as it runs
    alpha: float | None = None  # easgd moving rate; None means 0.9 / workers (the paper's beta/p)
    # diloco's outer optimizer: Nesterov SGD on the servers over the round's mean pseudo-gradient
    outer_lr: float = 0.7  # diloco: the outer step's learning rate (the paper's 0.7)
    outer_momentum: float = 0.9  # diloco: the outer step's Nesterov momentum, in [0, 1)
    fragments: int = 1  # diloco: fragments synced at staggered steps, overlapped (Streaming)
    fragment_sync_delay: int | None = None  # diloco --fragments: steps from push to merge
    # diloco: after a round x = alpha x_local + (1 - alpha) x_global, torchft's mixing; None:
    # ember's rule, the global parameters (with --fragments plus the steps taken in flight)
    mixing_alpha: float | None = None
    staleness: int = 2  # ssp: how many clocks a worker may run ahead of the slowest
    n_push: int = 1  # sgd: push accumulated gradients every n_push steps
    n_fetch: int = 1  # sgd: pull parameters every n_fetch steps
    compress: str = "none"  # one of CODECS: gradients, pulls and easgd's differences encoded
    engine: str = "local"  # local | spark
    master: str | None = None  # spark master URL; default local[workers]
    bind_address: str | None = None  # servers listen here; unset: see engines/addresses.py
    advertise_address: str | None = None  # and workers are told this address of theirs
    ports: str | None = None  # LO-HI: every port the run listens on is in this range
    out: str | None = None  # run directory; default runs/<timestamp>-<strategy>
    resume: str | None = None  # auto | path to a checkpoint directory
    seed: int = 0  # seeds model init, data shuffling and synthetic data
    threads: int = 1  # torch threads per worker
    synthetic_samples: int = 100_000  # synthetic-lr: training rows (a test set of 10% is added)
    synthetic_features: int = 100  # synthetic-lr: feature columns
    checkpoint_seconds: float = 30.0  # write a checkpoint at least this often
    checkpoint_steps: int = 0  # also every this many server steps (0: by time only)
    keep_checkpoints: int = 3  # newest checkpoints kept besides `last`
    replicas: int = 1  # server processes per shard: 2 adds a backup that takes over on failure
    replica_seconds: float = 0.25  # a backup lags its primary by at most about this
    max_restarts: int = 3  # times the engine restarts each dead worker or server process
    worker_timeout: float = 30.0  # a silent worker is dropped from the clock table after this
    max_workers: int | None = None  # workers a shard registers at once; None: 4 x workers + 1024
    request_timeout: float = 60.0  # a server that does not answer within this is an error
    encrypt: bool = True  # CURVE on every connection; off: plain TCP, for a trusted network
    wire_cipher: str = "curve"  # what encrypts: curve (every frame) | aead (payloads, bulk.py)
    wire_lanes: str = "auto"  # sockets per connection off shared memory: auto (probed) | 1..8
    log_every: int = 50  # steps between metrics records
    eval_every: int = 0  # steps between worker 0's test evaluations (0: at each epoch's end)
    eval_deferred: bool = False  # copy the parameters at each evaluation, evaluate after training
    tensorboard: bool = False  # also write scalars as TensorBoard event files
    report: bool = False  # draw report.png at the end (ember report RUN draws any run's)
    mlflow: bool = False  # log the run to one MLflow run (the API's mlflow= says it too)
    extra: dict[str, Any] = field(default_factory=dict)  # reserved for engine-specific settings

    @property
    def joinable(self) -> bool:
        """Whether a worker may join while the run goes on: an asynchronous strategy's run,
        or any run of a worker range whose strategy has servers."""
        return self.mode.joinable or (self.workers_max is not None and self.uses_server)

    @property
    def effective_alpha(self) -> float:
        return moving_rate(self.alpha, self.workers)

    def validate(self) -> RunConfig:
        """Raise ConfigError naming the first invalid field; return self when all are valid."""
        self.workers, self.workers_max = worker_range(self.workers, self.workers_max)
        self._check_types()
        _one_of("strategy", self.strategy, STRATEGIES)
        self.strategy = self.mode.value  # the plain name, which YAML can write and repr quotes
        _one_of("engine", self.engine, ENGINES)
        check_tau_policy(self.tau_policy, self.strategy)
        _one_of("compress", self.compress, CODECS)
        if self.compress != "none" and not self.uses_server:
            raise ConfigError(
                f"compress applies to exchanges with a parameter server; strategy "
                f"{self.strategy!r} has none, so compress must be 'none', got {self.compress!r}"
            )
        for name in (
            "workers",
            "servers",
            "epochs",
            "batch_size",
            "tau",
            "n_push",
            "n_fetch",
            "threads",
            "synthetic_samples",
            "synthetic_features",
            "keep_checkpoints",
            "log_every",
        ):
            _at_least(name, getattr(self, name), 1)
        for name in ("staleness", "checkpoint_steps", "seed", "eval_every", "max_restarts"):
            _at_least(name, getattr(self, name), 0)
        for name in (
            "lr",
            "checkpoint_seconds",
            "worker_timeout",
            "request_timeout",
            "replica_seconds",
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ConfigError(f"{name} must be > 0, got {value!r}")
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"momentum must be in [0, 1), got {self.momentum!r}")
        check_optimizer(self.optimizer, self.strategy, not self.mode.local_optimizer)
        check_scheduler(self.scheduler, self.warmup_steps, not self.mode.local_optimizer)
        check_precision(self.precision)
        check_device(self.device)
        if self.engine == "local" and self.device.startswith("cuda"):  # a Spark task: its own
            check_available(self.device, cuda_count())
        check_objective(self.loss, self.metrics)
        check_optimizer_args(self.optimizer_args, self.optimizer, not self.mode.local_optimizer)
        _one_of("data_mode", self.data_mode, DATA_MODES)
        _one_of("wire_cipher", self.wire_cipher, ("curve", "aead"))
        _one_of("wire_lanes", str(self.wire_lanes), ("auto", *map(str, range(1, 9))))
        _at_least("shuffle_buffer", self.shuffle_buffer, 1)
        if self.weight_decay < 0:
            raise ConfigError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0:
            raise ConfigError(f"clip_grad_norm must be > 0, got {self.clip_grad_norm!r}")
        if self.alpha is not None and not 0 < self.alpha <= 1:
            raise ConfigError(f"alpha must be in (0, 1], got {self.alpha!r}")
        if not self.outer_lr > 0:
            raise ConfigError(f"outer_lr must be > 0, got {self.outer_lr!r}")
        if not 0 <= self.outer_momentum < 1:
            raise ConfigError(f"outer_momentum must be in [0, 1), got {self.outer_momentum!r}")
        if self.mixing_alpha is not None and self.mode is not Strategy.DILOCO:
            raise ConfigError(
                f"mixing_alpha applies to strategy diloco only; got {self.mixing_alpha} with"
                f" strategy {self.strategy!r}"
            )
        if self.mixing_alpha is not None and not 0 <= self.mixing_alpha <= 1:
            raise ConfigError(f"mixing_alpha must be in [0, 1], got {self.mixing_alpha!r}")
        self._check_fragments()
        if self.max_workers is not None and not self.workers <= self.max_workers <= MAX_WORKERS:
            raise ConfigError(
                f"max_workers must be between workers ({self.workers}) and {MAX_WORKERS}, "
                f"got {self.max_workers}"
            )
        if self.nesterov and self.momentum == 0:
            raise ConfigError("nesterov needs momentum > 0, got momentum 0")
        if self.servers > 1 and not self.uses_server:
            raise ConfigError(
                f"servers must be 1 for strategy {self.strategy!r}, which uses no parameter server;"
                f" got {self.servers}"
            )
        if self.replicas not in (1, 2):
            raise ConfigError(f"replicas must be 1 or 2, got {self.replicas!r}")
        if self.replicas > 1 and not self.uses_server:
            raise ConfigError(
                f"replicas must be 1 for strategy {self.strategy!r}, which uses no parameter"
                f" server; got {self.replicas}"
            )
        if self.mode is Strategy.SINGLE and self.workers != 1:
            raise ConfigError(f"workers must be 1 for strategy 'single', got {self.workers}")
        check_worker_range(self)
        check_host("bind_address", self.bind_address)
        check_host("advertise_address", self.advertise_address)
        if self.ports is not None:  # each server slot listens, and on Spark the record collector
            slots = self.servers * self.replicas if self.uses_server else 0
            port_range(self.ports, slots, collector=self.engine == "spark")
        return self

    def _check_fragments(self) -> None:
        """Fragment f is the keys of servers / fragments servers, synced tau / fragments steps
        after the one before it."""
        _at_least("fragments", self.fragments, 1)
        if self.fragments > 1 and self.tau_policy != "fixed":
            # each fragment's stagger is tau / F steps from step 0, and a restarted worker
            # finds its place by it: a period that changed mid-run would leave no such place
            raise ConfigError(
                f"tau {self.tau_policy} applies to diloco without --fragments: the fragments"
                " sync on a fixed schedule of tau / fragments steps; give an integer tau"
            )
        if self.fragments > 1 and self.mode is not Strategy.DILOCO:
            raise ConfigError(
                f"fragments applies to strategy diloco only; got {self.fragments} with strategy"
                f" {self.strategy!r}"
            )
        for name in ("servers", "tau"):
            if self.fragments > 1 and getattr(self, name) % self.fragments:
                raise ConfigError(
                    f"fragments must divide {name}; got fragments {self.fragments} with {name}"
                    f" {getattr(self, name)}"
                )
        delay, stagger = self.fragment_sync_delay, self.tau // self.fragments
        if delay is not None and self.fragments == 1:
            raise ConfigError(
                f"fragment_sync_delay applies to diloco with --fragments 2 or more; got {delay}"
                " with fragments 1"
            )
        if delay is not None and not 0 <= delay <= stagger:
            raise ConfigError(
                f"fragment_sync_delay must be between 0 and tau / fragments ({stagger}), got"
                f" {delay}"
            )

    def _check_types(self) -> None:
        """YAML and the API hand over any type: name the field rather than fail deep inside."""
        for f in dataclasses.fields(self):
            value, kind = getattr(self, f.name), str(f.type)
            if value is None and "None" in kind:
                continue
            if kind.startswith("bool"):
                ok = isinstance(value, bool)
            elif kind.startswith("int"):
                ok = isinstance(value, int) and not isinstance(value, bool)
            elif kind.startswith("float"):
                ok = (
                    isinstance(value, (int, float))
                    and not isinstance(value, bool)
                    and math.isfinite(value)
                )
            elif kind.startswith("str"):
                ok = isinstance(value, str)
            else:
                continue
            if not ok:
                wanted = kind.split(" ")[0].replace("float", "a finite number")
                raise ConfigError(f"{f.name} must be {wanted}, got {value!r}")
        if self.request_timeout <= self.worker_timeout:
            raise ConfigError(
                f"request_timeout must be greater than worker_timeout ({self.worker_timeout:g}),"
                f" since a synchronous worker may wait that long for a silent peer; got "
                f"{self.request_timeout:g}"
            )

    def run_dir(self) -> Path:
        if self.out:
            return Path(self.out)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return Path("runs") / f"{stamp}-{self.strategy}-{os.getpid()}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _one_of(name: str, value: object, allowed: tuple[str, ...]) -> None:
    one_of(name, value, allowed)


def _at_least(name: str, value: object, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")


FIELD_NAMES = tuple(f.name for f in dataclasses.fields(RunConfig) if f.name != "extra")
# Fields that hold a mapping (YAML writes one; a flag takes it as JSON)
MAPPING_FIELDS = ("optimizer_args",)
