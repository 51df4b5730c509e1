"""A run as the edge parsed it (ParsedRun), and what an engine is: `ember train`, ember.fit,
ember.run and ember.spark.fit each build a ParsedRun and call `execute` with an engine
(engine.py), the one path from a parsed run to a finished one on every engine."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ember.config import RunConfig
from ember.config.objects import NO_OBJECTS, UserObjects
from ember.errors import ConfigError

if TYPE_CHECKING:
    from ember.data import Dataset
    from ember.engines.rundir import RunResult
    from ember.worker.spec import UserLoop


@dataclass(frozen=True)
class DataFrameInput:
    """ember.spark.fit's DataFrame: its columns, and the test rows (None: a seeded tenth)."""

    df: Any
    features_col: str = "features"
    label_col: str = "label"
    test_df: Any = None
    weight_col: str | None = None  # each row's weight in the loss; None: every row weighs 1


@dataclass(frozen=True)
class ParsedRun:
    """Everything a run is, parsed once: its configuration, the objects it was handed in
    place of names, and where its data and loop come from when not from the configuration:
    `dataset` (arrays the caller holds), `frame` (a Spark DataFrame), `loop` (ember.run's
    function, run in place of the built-in loop)."""

    config: RunConfig
    objects: UserObjects = NO_OBJECTS
    dataset: Dataset | None = None
    frame: DataFrameInput | None = None
    loop: UserLoop | None = None
    show_progress: bool | None = True  # None: on a terminal only
    mlflow: bool | None = False  # log to MLflow; None: when an MLflow run is active

    @property
    def progress_shown(self) -> bool:
        """Whether to show progress: as asked, or (None) where someone watches, a terminal,
        and not in a log or a notebook's pipe."""
        return self.show_progress if self.show_progress is not None else sys.stderr.isatty()

    def execute(self, engine: Engine) -> RunResult:
        """Train on `engine` (engines.engine_named(config.engine) for the configured one),
        logged to MLflow as `mlflow` says, and return the finished run."""
        from ember.metrics.tracking import tracked

        if self.config.report and importlib.util.find_spec("matplotlib") is None:
            # said before anything starts, not once the run has trained
            raise ConfigError("report needs matplotlib: pip install 'ember[report]'")
        return tracked(self.mlflow, self.config, lambda: engine.train(self))


class Engine(Protocol):
    name: str

    def train(self, run: ParsedRun) -> RunResult:
        """Run `run`'s servers and workers to the end; every process is gone on return."""
        ...
