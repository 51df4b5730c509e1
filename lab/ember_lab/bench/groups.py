"""The repetitions of each bench row, grouped for the report's tables and plots."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from ember.config import STRATEGIES

Record = dict[str, Any]

ENGINE_ORDER = ("mllib", "local", "spark")
TASK_TITLES = {
    "lr": "binary logistic regression",
    "mlp": "multilayer perceptron",
    "lenet": "LeNet",
    "cnn": "CNN with BatchNorm",
}


@dataclass
class Group:
    """The repetitions of one (task, row, engine)."""

    task: str
    row: str
    engine: str
    records: list[Record]
    link: str | None = None  # the emulated link's rate, for rows on the cluster

    @property
    def ok(self) -> list[Record]:
        return [r for r in self.records if r.get("status") != "failed"]

    @property
    def failed(self) -> list[Record]:
        return [r for r in self.records if r.get("status") == "failed"]

    @property
    def is_mllib(self) -> bool:
        return self.engine == "mllib" or self.records[0].get("system") == "mllib"

    def first(self, key: str) -> Any:
        return next((r[key] for r in self.records if r.get(key) is not None), None)

    def values(self, key: str) -> list[float]:
        return [float(r[key]) for r in self.ok if r.get(key) is not None]

    def median(self, key: str) -> float | None:
        values = self.values(key)
        return statistics.median(values) if values else None

    def order(self) -> tuple[int, float, str, int]:
        """mllib, then the known strategies in STRATEGIES' order, then the rest by label."""
        strategy = self.first("strategy")
        if self.is_mllib:
            rank = 0
        elif strategy in STRATEGIES:
            rank = 1 + STRATEGIES.index(strategy)
        else:
            rank = 1 + len(STRATEGIES)
        engine = (
            ENGINE_ORDER.index(self.engine) if self.engine in ENGINE_ORDER else len(ENGINE_ORDER)
        )
        return rank, float(self.first("tau") or 0), self.row, engine


def group_records(records: list[Record]) -> dict[str, list[Group]]:
    """Groups by task, in the order lr, mlp, lenet, then any other task as first seen."""
    groups: dict[tuple[str, str, str, str | None], list[Record]] = {}
    for record in records:
        if record.get("kind", "row") == "row":
            key = (
                str(record.get("task")),
                str(record.get("row")),
                str(record.get("engine")),
                record.get("link"),
            )
            groups.setdefault(key, []).append(record)
    by_task: dict[str, list[Group]] = {}
    for (task, row, engine, link), members in groups.items():
        members.sort(key=lambda r: r.get("repeat") or 0)
        by_task.setdefault(task, []).append(Group(task, row, engine, members, link))
    known = [t for t in TASK_TITLES if t in by_task]
    tasks = known + [t for t in by_task if t not in known]
    return {t: sorted(by_task[t], key=Group.order) for t in tasks}


def target_of(groups: list[Group]) -> tuple[str, float | None]:
    metrics = [r.get("target_metric") for g in groups for r in g.records if r.get("target_metric")]
    values = [r.get("target_value") for g in groups for r in g.records]
    metric = max(set(metrics), key=metrics.count) if metrics else "test_accuracy"
    known = [float(v) for v in values if v is not None]
    return str(metric), (max(set(known), key=known.count) if known else None)


def sweep_rows(groups: list[Group]) -> list[Group]:
    sweep = [g for g in groups if g.first("sweep")]
    return sorted(sweep, key=lambda g: (g.first("tau") is None, g.first("tau") or 0, g.engine))


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def task_title(task: str, groups: list[Group]) -> str:
    """The model, and the data with its sizes as the task's rows loaded it."""

    def first(key: str) -> Any:
        return next((v for g in groups if (v := g.first(key)) is not None), None)

    title, data, train = TASK_TITLES.get(task, task), first("data"), first("train_samples")
    parts = [f"{title} on {data}" if data else title]
    if train is not None:
        test, features = first("test_samples"), first("features")
        parts.append(f"{train:,} training and {test:,} test samples of {features:,} features")
    if (epochs := first("epochs")) is not None:
        parts.append(_count(epochs, "epoch"))
    if (iterations := first("iterations")) is not None:
        parts.append("MLlib " + _count(iterations, "iteration"))
    return ", ".join(parts)
