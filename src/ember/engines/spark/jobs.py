"""The Spark jobs of a training run, each on a thread of its own: the warm-up, and training."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from ember.data.arrow import FEATURES
from ember.engines.spark.connect import TaggedJobs, is_connect
from ember.engines.spark.session import stopped
from ember.errors import EmberError
from ember.metrics.records import Record

RECORDS = "record string"  # what a training task yields: its progress records as JSON


def import_worker(batches: Iterator[Any]) -> Iterator[Any]:
    """In a task: nothing but the imports a training task needs (torch above all)."""
    import pyarrow as pa

    import ember.engines.spark.task  # noqa: F401 - what a training task unpickles: torch and all

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"record": [""]})


class GroupedJobs:
    """A job's control through the SparkContext: a job group to cancel it by, and the
    stage's attempts from Spark's status tracker."""

    def __init__(self, spark: Any) -> None:
        self.context = spark.sparkContext
        self.group = f"ember-{uuid.uuid4().hex[:12]}"

    def enter(self, description: str) -> None:
        """On the job's thread, before it runs anything."""
        self.context.setJobGroup(self.group, description, interruptOnCancel=True)

    def leave(self) -> None:
        pass

    def saw(self, record: Record) -> None:
        pass  # the status tracker knows the attempts

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

    def stopped(self) -> bool:
        return stopped(self.context)


class Job:
    """A Spark job on a thread of its own, so the driver can watch servers meanwhile."""

    def __init__(self, spark: Any, make_frame: Callable[[], Any], description: str) -> None:
        self.control = TaggedJobs(spark) if is_connect(spark) else GroupedJobs(spark)
        self.rows: list[str] = []
        self.error: BaseException | None = None
        args = (make_frame, description)
        self.thread = threading.Thread(target=self._run, args=args, daemon=True)
        self.thread.start()

    def _run(self, make_frame: Callable[[], Any], description: str) -> None:
        self.control.enter(description)
        try:  # the frame is planned here too: on a fresh session that alone takes a while
            self.rows = [row["record"] for row in make_frame().collect()]
        except BaseException as exc:
            self.error = exc
        finally:
            self.control.leave()

    def attempt(self) -> int:
        """The newest attempt of the job's stages: above 0 once Spark retried one."""
        return self.control.attempt()

    def cancel(self) -> None:
        # A failure here means the JVM is gone (a Ctrl-C reached it too, or broke the gateway
        # mid-call), and its tasks with it: nothing is left to cancel, and the error that
        # ends the run (the interrupt) must not be replaced by this one.
        with contextlib.suppress(Exception):
            self.control.cancel()
        self.thread.join(30)


def start_warm_up(spark: Any, workers: int) -> Job:
    """A small job, run while the driver loads data and starts servers, that starts Spark's
    Python workers and imports ember and torch in them: idle workers are reused by the next
    job, so the training tasks start without that cost (seconds on a fresh session). It also
    finds out early when the executors cannot import ember at all."""

    def one_row_per_task() -> Any:  # with a features array, as training rows have
        from pyspark.sql import functions as F

        frame = spark.range(0, workers, numPartitions=workers)
        frame = frame.select(F.array(F.lit(0.0).cast("float")).alias(FEATURES), "id")
        return frame.mapInArrow(import_worker, RECORDS)

    return Job(spark, one_row_per_task, "ember warm-up")


def wait_for_warm_up(warm_up: Job, timeout: float) -> None:
    warm_up.thread.join(timeout)
    if warm_up.error is not None:
        raise EmberError(
            "a first small Spark job, which starts the Python workers and imports ember in"
            " them, failed (is ember installed on every executor, for the Python in"
            f" PYSPARK_PYTHON?):\n{python_error(warm_up.error)}"
        )


def python_error(exc: BaseException) -> str:
    """The task's Python traceback out of Spark's error, without the JVM stack around it."""
    text = str(exc)
    start = text.find("Traceback (most recent call last)")
    if start < 0:
        return text[:2000]
    ends = [i for i in (text.find("\n\tat ", start), text.find("SQLSTATE", start)) if i > 0]
    return text[start : min(ends, default=len(text))].strip()
