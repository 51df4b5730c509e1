"""The engines a ParsedRun executes on, by the name config.engine gives: each imports its
machinery only when it trains, so that choosing one costs nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember.errors import ConfigError

if TYPE_CHECKING:
    from ember.engines.parsed import Engine, ParsedRun
    from ember.engines.rundir import RunResult


class LocalEngine:
    """Spawned server and worker processes on this machine (engines/local.py)."""

    name = "local"

    def train(self, run: ParsedRun) -> RunResult:
        from ember.engines.forking import start_forkserver, stop_forkserver

        start_forkserver()  # its imports of torch and ember overlap with the launcher's work
        try:
            from ember.engines.local import train_local
        except BaseException:
            stop_forkserver()
            raise
        return train_local(run)


class SparkEngine:
    """One Spark barrier task per worker, servers by the driver (engines/spark/)."""

    name = "spark"

    def train(self, run: ParsedRun) -> RunResult:
        try:
            from ember.engines.spark import train_dataframe, train_spark
        except ImportError as exc:
            raise ConfigError(f"engine 'spark' is not available here: {exc}") from exc
        return train_dataframe(run) if run.frame is not None else train_spark(run)


ENGINES: dict[str, type[Engine]] = {"local": LocalEngine, "spark": SparkEngine}


def engine_named(name: str) -> Engine:
    """The engine `name` (config.engine) names."""
    engine = ENGINES.get(name)
    if engine is None:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}; got {name!r}")
    return engine()
