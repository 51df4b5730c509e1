"""The Spark jobs of a training run: the warm-up, and the training job watched from a thread."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

from ember.data.spark import FEATURES
from ember.errors import EmberError

RECORDS = "record string"  # what a training task yields: its progress records as JSON


def import_worker(batches: Iterator[Any]) -> Iterator[Any]:
    """In a task: nothing but the imports a training task needs (torch above all)."""
    import pyarrow as pa

    import ember.engines.spark  # noqa: F401 - what a training task unpickles: torch and all

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"record": [""]})


class WarmUp:
    """A small job, run while the driver loads data and starts servers, that starts Spark's
    Python workers and imports ember and torch in them: idle workers are reused by the next
    job, so the training tasks start without that cost (seconds on a fresh session). It also
    finds out early when the executors cannot import ember at all."""

    def __init__(self, spark: Any, workers: int) -> None:
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(spark, workers), daemon=True)
        self.thread.start()

    def _run(self, spark: Any, workers: int) -> None:
        from pyspark.sql import functions as F

        try:  # one row per task, with a features array as training rows have
            frame = spark.range(0, workers, numPartitions=workers)
            frame = frame.select(F.array(F.lit(0.0).cast("float")).alias(FEATURES), "id")
            frame.mapInArrow(import_worker, RECORDS).collect()
        except BaseException as exc:
            self.error = exc

    def wait(self, timeout: float) -> None:
        self.thread.join(timeout)
        if self.error is not None:
            raise EmberError(
                "a first small Spark job, which starts the Python workers and imports ember in"
                " them, failed (is ember installed on every executor, for the Python in"
                f" PYSPARK_PYTHON?):\n{python_error(self.error)}"
            )


class Job:
    """The training job on a thread of its own, so the driver can watch servers meanwhile."""

    def __init__(self, spark: Any, frame: Any) -> None:
        self.context = spark.sparkContext
        self.group = f"ember-{uuid.uuid4().hex[:12]}"
        self.rows: list[str] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(frame,), daemon=True)
        self.thread.start()

    def _run(self, frame: Any) -> None:
        self.context.setJobGroup(self.group, "ember training", interruptOnCancel=True)
        try:
            self.rows = [row["record"] for row in frame.collect()]
        except BaseException as exc:
            self.error = exc

    def attempt(self) -> int:
        """The newest attempt of any stage of the job: above 0 once Spark retried a stage."""
        tracker = self.context.statusTracker()
        attempts = [0]
        for job_id in tracker.getJobIdsForGroup(self.group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job else []:
                stage = tracker.getStageInfo(stage_id)
                attempts.append(stage.currentAttemptId if stage else 0)
        return max(attempts)

    def cancel(self) -> None:
        self.context.cancelJobGroup(self.group)
        self.thread.join(30)


def python_error(exc: BaseException) -> str:
    """The task's Python traceback out of Spark's error, without the JVM stack around it."""
    text = str(exc)
    start = text.find("Traceback (most recent call last)")
    if start < 0:
        return text[:2000]
    ends = [i for i in (text.find("\n\tat ", start), text.find("SQLSTATE", start)) if i > 0]
    return text[start : min(ends, default=len(text))].strip()
