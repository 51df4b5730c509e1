"""Spark Connect sessions: what a run reads and controls through the Connect API alone, where
a classic session would use its SparkContext (the master, the settings, the task slots, job
cancellation and the stage's attempts)."""

from __future__ import annotations

import uuid
from typing import Any

from ember.config import RunConfig
from ember.errors import ConfigError
from ember.metrics.records import Record


def is_connect(spark: Any) -> bool:
    """Whether `spark` is a Spark Connect client's session: it has no SparkContext."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def setting(spark: Any) -> Any:
    """A lookup (key, default) -> value of the session's configuration, Spark's and SQL's."""

    def look(key: str, default: Any = None) -> Any:
        value = spark.conf.get(key, None)
        return default if value is None else value

    return look


def master(spark: Any) -> str:
    found = spark.conf.get("spark.master", None)
    if not found:
        raise ConfigError("the Spark Connect server reports no spark.master")
    return str(found)


def configured_slots(config: RunConfig, url: str, look: Any) -> None:
    """A cluster master's task slots as its settings promise them (spark.cores.max, or
    spark.executor.instances x spark.executor.cores), since a Connect client cannot count
    the running executors; unset, Spark's own check of the barrier stage stands."""
    task_cpus = max(1, int(look("spark.task.cpus", "1")))
    cores = look("spark.cores.max")
    if cores is None and look("spark.executor.instances") and look("spark.executor.cores"):
        cores = int(look("spark.executor.instances")) * int(look("spark.executor.cores"))
    if cores is None:
        return
    slots = int(cores) // task_cpus
    if slots < config.workers:
        raise ConfigError(
            f"master {url!r} runs {slots} task(s) at once (the Spark Connect server's"
            " spark.cores.max or spark.executor.instances x spark.executor.cores, over"
            f" spark.task.cpus), but the barrier stage needs one per worker: {config.workers};"
            " lower workers or give the server's application more cores"
        )


class TaggedJobs:
    """A job's control through Spark Connect: its operations carry a tag of their own (the
    tags of the thread that starts them) to cancel them by; the stage's attempt is counted
    on the tasks' incarnations, one per attempt, as their records arrive."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self.tag = f"ember-{uuid.uuid4().hex[:12]}"
        self._incarnations: dict[int, set[int]] = {}

    def enter(self, description: str) -> None:
        """On the job's thread, before it runs anything."""
        self.spark.addTag(self.tag)

    def leave(self) -> None:
        self.spark.removeTag(self.tag)

    def saw(self, record: Record) -> None:
        """A record a task streamed or returned: a new incarnation of a rank is a new attempt."""
        rank, incarnation = getattr(record, "rank", None), record.incarnation
        if isinstance(rank, int) and isinstance(incarnation, int):
            self._incarnations.setdefault(rank, set()).add(incarnation)

    def attempt(self) -> int:
        return max((len(seen) for seen in self._incarnations.values()), default=1) - 1

    def cancel(self) -> None:
        self.spark.interruptTag(self.tag)
