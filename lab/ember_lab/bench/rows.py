"""What `ember bench` runs: the tasks with their targets, the settings, and the row list."""

from __future__ import annotations

import itertools
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ember.config import DILOCO_TAU, ENGINES, STRATEGIES, RunConfig, Strategy, make_config
from ember.errors import ConfigError
from ember.probe import Dataset, load_dataset


@dataclass(frozen=True)
class Task:
    """One workload of the comparison, with the target every row races to."""

    name: str
    model: str
    data: str
    epochs: int
    target_metric: str  # test_accuracy (higher is better) or test_loss (lower is better)
    target_value: float
    mllib_iterations: int  # MLlib's optimizer iterations (about one pass over the data each)
    mllib_segments: int = 1  # fits in a row, each warm-started, to trace the target metric
    synthetic_samples: int = 100_000
    synthetic_features: int = 100
    lr: float = 0.05  # ember's learning rate for this task

    def reached(self, value: float | None) -> bool:
        if value is None:  # a figure that was not finite (a diverged run): no target is met
            return False
        if self.target_metric == "test_loss":
            return value <= self.target_value
        return value >= self.target_value

    def load(self, seed: int) -> Dataset:
        return load_dataset(
            self.data,
            seed=seed,
            synthetic_samples=self.synthetic_samples,
            synthetic_features=self.synthetic_features,
        )


def make_tasks(
    quick: bool, lr_rows: int, lr_features: int, epochs: int | dict[str, int] | None = None
) -> dict[str, Task]:
    """The seeds' two workloads (and LeNet, and a CNN with BatchNorm), full size or reduced for
    --quick; `epochs`, when given, replaces every task's own, or the named tasks' (each still
    races to its target)."""
    tasks = _tasks(quick, lr_rows, lr_features)
    return {k: replace(t, epochs=_for_task(epochs, k, t.epochs)) for k, t in tasks.items()}


def _tasks(quick: bool, lr_rows: int, lr_features: int) -> dict[str, Task]:
    if quick:
        return {
            "lr": Task(
                "lr", "logreg", "synthetic-lr", 1, "test_loss", 0.35, 5, 1, 20_000, 100, 0.01
            ),
            "mlp": Task("mlp", "mlp", "digits", 1, "test_accuracy", 0.85, 4, 2),
            "lenet": Task("lenet", "lenet", "digits", 1, "test_accuracy", 0.85, 4, 2),
            "cnn": Task("cnn", "cnn_bn", "digits", 1, "test_accuracy", 0.85, 4, 2),
        }
    # lr: the Bayes-optimal log loss of synthetic-lr is about 0.29; 0.30 is close to the optimum
    return {
        "lr": Task(
            "lr", "logreg", "synthetic-lr", 2, "test_loss", 0.30, 20, 1, lr_rows, lr_features, 0.01
        ),
        "mlp": Task("mlp", "mlp", "mnist", 5, "test_accuracy", 0.97, 40, 2),
        "lenet": Task("lenet", "lenet", "mnist", 3, "test_accuracy", 0.98, 40, 2),
        "cnn": Task("cnn", "cnn_bn", "mnist", 3, "test_accuracy", 0.98, 40, 2),
    }


@dataclass
class BenchSettings:
    out: Path
    quick: bool = False
    repeat: int = 1
    tasks: list[str] = field(default_factory=lambda: ["lr", "mlp"])
    strategies: list[str] = field(default_factory=lambda: list(STRATEGIES))
    engines: list[str] = field(default_factory=lambda: ["local"])
    mllib: bool = True
    taus: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    sweep_tasks: list[str] = field(default_factory=lambda: ["mlp"])
    workers: int = 2
    lr_rows: int = 1_000_000
    lr_features: int = 100
    epochs: int | dict[str, int] | None = None  # every task's epochs, or some tasks', instead
    # of their own
    seed: int = 0
    hosts: int = 0  # worker hosts of the emulated cluster for the link rows; 0: no link rows
    links: list[str] = field(default_factory=lambda: ["1gbit", "100mbit"])
    compress: list[str] = field(default_factory=list)  # compressed bsp/async/easgd rows on links
    tau_policies: list[str] = field(default_factory=lambda: ["auto", "loss"])  # easgd-async's
    # adaptive rows on links
    diloco_tau: int | dict[str, int] = DILOCO_TAU  # the diloco rows' period, or some tasks'
    fragments: list[int] = field(default_factory=list)  # a diloco row per count, synced in
    # that many fragments (Streaming DiLoCo), over as many servers
    outer: list[tuple[float, float]] = field(default_factory=list)  # a whole-model diloco row
    # per outer (lr, momentum) beside the default's, for a comparison of outer steps
    torch: bool = True  # the TorchDistributor row on links
    local: bool = True  # the rows on this host (off: only the link rows)
    links_run: dict[str, Any] = field(default_factory=dict)  # what the link rows measured, or
    # why they were skipped: set by the run
    wire_run: dict[str, Any] = field(default_factory=dict)  # each wire's exchange: set by the run

    def diloco_period(self, task: str) -> int:
        """The diloco rows' tau on this task: a period that suits one model's curve (its
        rounds ending where the bench copies the model to score) need not suit another's."""
        return _for_task(self.diloco_tau, task, DILOCO_TAU)

    def to_dict(self) -> dict[str, Any]:
        """The settings as used: a quick run's lr task has sizes of its own."""
        lr = make_tasks(self.quick, self.lr_rows, self.lr_features)["lr"]
        used = {"lr_rows": lr.synthetic_samples, "lr_features": lr.synthetic_features}
        return {**asdict(self), "out": str(self.out), **used}

    def validate(self, tasks: dict[str, Task]) -> None:
        """Raise ConfigError naming the first unknown name, before any row runs."""
        for what, given, known in (
            ("task", self.tasks, list(tasks)),
            ("sweep task", self.sweep_tasks, list(tasks)),
            ("task", _named(self.epochs), list(tasks)),
            ("task", _named(self.diloco_tau), list(tasks)),
            ("strategy", self.strategies, list(STRATEGIES)),
            ("engine", self.engines, list(ENGINES)),
        ):
            unknown = [name for name in given if name not in known]
            if unknown:
                raise ConfigError(
                    f"unknown {what} {', '.join(unknown)}; choose from {', '.join(known)}"
                )
        for link in self.links:
            tc_rate(link)
        for kind in self.compress:
            make_config({"compress": kind})  # a bad name is refused before any row runs
        for policy in self.tau_policies:
            if policy not in ("auto", "loss"):
                raise ConfigError(f"unknown tau policy {policy}; choose from auto, loss")
        periods = sorted({self.diloco_period(task) for task in self.tasks})
        for tau, count in itertools.product(periods, self.fragments):  # fragment f is server
            # f's keys; count must divide tau
            make_config({"strategy": "diloco", "tau": tau, "fragments": count, "servers": count})
        for lr, momentum in self.outer:
            make_config({"strategy": "diloco", "outer_lr": lr, "outer_momentum": momentum})
        if (self.out / "results.jsonl").exists():
            raise ConfigError(
                f"{self.out} already holds a benchmark's results.jsonl; choose another --out"
            )


def _named(per_task: int | dict[str, int] | None) -> list[str]:
    """The task names a per-task setting gives (none for a setting of every task)."""
    return list(per_task) if isinstance(per_task, dict) else []


def _for_task(per_task: int | dict[str, int] | None, task: str, default: int) -> int:
    """A per-task setting's count for `task`: the one count of every task, the task's own
    pair, or `default` where the setting gives neither."""
    if isinstance(per_task, dict):
        return per_task.get(task, default)
    return default if per_task is None else per_task


# one worker alone, which the Spark engine does not run (its local row stands)
OFF_SPARK = (Strategy.SINGLE,)


@dataclass(frozen=True)
class Row:
    task: Task
    label: str
    system: str  # ember | mllib | torch
    engine: str
    config: RunConfig | None = None  # ember rows
    sweep: bool = False
    link: str | None = None  # the emulated link's rate for rows on the cluster, else None


def plan_rows(settings: BenchSettings, tasks: dict[str, Task]) -> list[Row]:
    rows: list[Row] = []
    if not settings.local:  # single, for the link rows' speedup: it has no Spark-engine row
        for name in settings.tasks if Strategy.SINGLE in settings.strategies else []:
            config = _config(settings, tasks[name], Strategy.SINGLE, "local")
            rows.append(Row(tasks[name], Strategy.SINGLE, "ember", "local", config))
    for name in settings.tasks if settings.local else []:
        task = tasks[name]
        if settings.mllib:
            rows.append(Row(task, "mllib", "mllib", "mllib"))
        for engine in settings.engines:
            for strategy in settings.strategies:
                if engine == "spark" and Strategy(strategy) in OFF_SPARK:
                    continue  # nothing to exchange: its local row stands
                config = _config(settings, task, strategy, engine)
                label = strategy if engine == "local" else f"{strategy} (spark)"
                rows.append(Row(task, label, "ember", engine, config))
            for label, config in _diloco_rows(settings, task, engine):
                label = label if engine == "local" else f"{label} (spark)"
                rows.append(Row(task, label, "ember", engine, config))
        if name in settings.sweep_tasks:
            for tau in settings.taus:
                config = replace(_config(settings, task, Strategy.EASGD_ASYNC, "local"), tau=tau)
                rows.append(Row(task, f"easgd-async tau={tau}", "ember", "local", config, True))
    return rows


def tc_rate(link: str) -> str | None:
    """A --link name as a tc rate ("100mbit"), or None for "unlimited"; a ConfigError naming it
    when it is neither."""
    if link == "unlimited":
        return None
    if not re.fullmatch(r"[1-9]\d*(\.\d+)?[kmg]?bit", link):
        raise ConfigError(
            f"--link {link!r}: expected a rate such as 1gbit, 100mbit, 500kbit, or unlimited"
        )
    return link


def plan_link_rows(settings: BenchSettings, tasks: dict[str, Task], link: str) -> list[Row]:
    """The rows on the emulated cluster at one link rate: MLlib, TorchDistributor, every
    strategy on the Spark engine across hosts, diloco in --fragments, compressed bsp/async, the
    easgd-async tau sweep and easgd-async with each --tau-policies policy (auto, loss),
    uncompressed and with each --compress codec."""
    rows = []
    for name in settings.tasks:
        task = tasks[name]
        if settings.mllib:
            rows.append(Row(task, "mllib", "mllib", "mllib", link=link))
        if settings.torch:
            rows.append(Row(task, "torchdistributor", "torch", "torch", link=link))
        for strategy in settings.strategies:
            if Strategy(strategy) in OFF_SPARK:
                continue  # single runs once, on this host, for the speedups
            config = _config(settings, task, strategy, "spark", settings.hosts)
            rows.append(Row(task, strategy, "ember", "spark", config, link=link))
        for label, config in _diloco_rows(settings, task, "spark", settings.hosts):
            rows.append(Row(task, label, "ember", "spark", config, link=link))
        for kind in [k for k in settings.compress if k != "none"]:
            for strategy in (Strategy.BSP, Strategy.ASYNC):
                config = _config(settings, task, strategy, "spark", settings.hosts)
                config = replace(config, compress=kind).validate()
                rows.append(Row(task, f"{strategy} {kind}", "ember", "spark", config, link=link))
        if name not in settings.sweep_tasks:
            continue
        easgd = _config(settings, task, Strategy.EASGD_ASYNC, "spark", settings.hosts)
        for kind in ["none", *[k for k in settings.compress if k != "none"]]:
            for policy in settings.tau_policies:
                config = replace(easgd, tau_policy=policy, compress=kind).validate()
                name = f"easgd-async tau={policy}" + ("" if kind == "none" else f" {kind}")
                rows.append(Row(task, name, "ember", "spark", config, link=link))
        for tau in settings.taus:
            config = replace(easgd, tau=tau)
            rows.append(Row(task, f"easgd-async tau={tau}", "ember", "spark", config, True, link))
    return rows


def _config(
    settings: BenchSettings, task: Task, strategy: str, engine: str, workers: int = 0
) -> RunConfig:
    workers = 1 if strategy == Strategy.SINGLE else workers or settings.workers
    # diloco's rounds want long periods (RunConfig's tau is easgd's 8; a user's --strategy
    # diloco gets DILOCO_TAU, and the bench its own setting)
    tau = settings.diloco_period(task.name) if strategy == Strategy.DILOCO else RunConfig.tau
    return RunConfig(
        data=task.data,
        model=task.model,
        strategy=strategy,
        workers=workers,
        engine=engine,
        epochs=task.epochs,
        tau=tau,
        lr=task.lr,
        seed=settings.seed,
        synthetic_samples=task.synthetic_samples,
        synthetic_features=task.synthetic_features,
        checkpoint_seconds=3600.0,  # the final checkpoint only: a row measures training
    ).validate()


def _diloco_rows(
    settings: BenchSettings, task: Task, engine: str, workers: int = 0
) -> list[tuple[str, RunConfig]]:
    """When diloco is among the strategies: a whole-model row per --outer (lr, momentum), and a
    row per --fragments count above 1 with a server per fragment (fragment f is the keys of
    servers [f S/F, (f+1) S/F))."""
    if Strategy.DILOCO not in settings.strategies:
        return []
    diloco = _config(settings, task, Strategy.DILOCO, engine, workers)
    rows = [
        (f"diloco outer={lr:g}/{momentum:g}", replace(diloco, outer_lr=lr, outer_momentum=momentum))
        for lr, momentum in settings.outer
    ]
    counts = [count for count in settings.fragments if count > 1]
    return rows + [
        (f"diloco fragments={count}", replace(diloco, fragments=count, servers=count).validate())
        for count in counts
    ]
