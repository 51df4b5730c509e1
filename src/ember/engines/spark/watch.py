"""The Spark engine's workers as the Run's watch loop drives them: one barrier stage whose
tasks stream their records to the driver's collector while they train. Spark retries the
stage as a whole when a task fails, so an exit seen here ends the run."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ember.config import RunConfig
from ember.engines.servers import ServerGroup
from ember.engines.spark.jobs import GroupedJobs, Job, python_error
from ember.engines.spark.records import RecordCollector
from ember.engines.spark.session import driver_memory
from ember.engines.workers import Exit, Polled
from ember.errors import WorkerFailed
from ember.metrics.records import (
    Failure,
    FinalState,
    Record,
    RunEvent,
    Unreachable,
    WorkerError,
    WorkerStart,
)
from ember.ps import fetch_state

SERVER_PROBE_SECONDS = 5.0  # until a task has started: how often the servers are asked


class SparkWorkers:
    """The training job's tasks. Until one has started, the servers are asked every few
    seconds whether a worker reached them (that fetches the parameters too, hence not more
    often): a job whose tasks never run ends within request_timeout, naming where to look."""

    restarts_ranks = False  # Spark's stage attempts are the restarts

    def __init__(
        self,
        spark: Any,
        make_frame: Callable[[], Any],
        collector: RecordCollector,
        config: RunConfig,
        servers: ServerGroup | None,
        secret: bytes,
    ) -> None:
        self.spark, self.make_frame, self.collector = spark, make_frame, collector
        self.config, self.servers, self.secret = config, servers, secret
        self.job: Job | None = None
        self.states: list[FinalState] = []  # allreduce's rank 0 final state, at the end
        self.over = False  # the job ended and what it returned was polled
        self.seen_attempt = 0
        # without servers, the tasks' own timeouts (the rendezvous, gloo's) bound their start
        self.workers_seen = servers is None
        self.started = self.last_probe = 0.0

    def start(self) -> None:
        self.job = Job(self.spark, self.make_frame, "ember training")
        self.started = self.last_probe = time.monotonic()

    def running(self) -> bool:
        return not self.over

    def poll(self, timeout: float) -> Polled:
        job, polled = self._job(), Polled()
        job.thread.join(timeout)
        finished = not job.thread.is_alive()
        for streamed in self.collector.drain():
            job.control.saw(streamed)
            polled.shown.append(streamed)
            self.workers_seen = self.workers_seen or isinstance(streamed, WorkerStart)
            if isinstance(streamed, WorkerError) and not streamed.retry:
                # the other tasks would only fail alike, or wait for it
                polled.exits.append(_exit(streamed.error))
                return polled
        attempt = job.attempt()
        if attempt > self.seen_attempt:
            retry = RunEvent(event="stage retry", details={"attempt": attempt})
            polled.notes.append((retry, f"Spark retries the training stage (attempt {attempt})"))
            self.seen_attempt = attempt
        if finished:
            self._ended(job, polled)
        elif not self.workers_seen and time.monotonic() - self.last_probe > SERVER_PROBE_SECONDS:
            self._probe_servers()
        return polled

    def restart(self, rank: int, incarnation: int) -> None:
        raise AssertionError("Spark retries its tasks itself")  # restarts_ranks is False

    def failure(self, exit: Exit, why: str) -> tuple[Record, str]:
        tries = self._job().attempt() + 1
        return Failure(error=exit.error), (
            f"the Spark training job failed ({tries} attempt(s)):\n{exit.error}"
        )

    def pids(self) -> list[int | None]:
        return []  # the executors' processes are Spark's, not the driver's

    def stop(self) -> None:
        if self.job is not None:
            self.job.cancel()  # tasks first, so the servers' state is final when it is saved

    def _job(self) -> Job:
        assert self.job is not None, "start() first"
        return self.job

    def _ended(self, job: Job, polled: Polled) -> None:
        """The records the tasks return, which are those of the attempt that finished, to
        metrics.jsonl; or the job's error, or the tasks' one line saying it all."""
        if job.error is not None:
            polled.exits.append(_exit(self._job_error(job)))
            return
        records = [Record.from_json(json.loads(line)) for line in job.rows]
        for record in records:
            job.control.saw(record)
        for kind in (Unreachable, WorkerError):
            said = [r.error for r in records if isinstance(r, kind)]
            if said:
                polled.exits.append(_exit(said[0]))
                return
        attempt = job.attempt()
        self.states = [r for r in records if isinstance(r, FinalState)]
        # a state record carries megabytes of parameters: not a metric
        polled.records += [
            replace(r, attempt=attempt) for r in records if not isinstance(r, FinalState)
        ]
        self.over = True

    def _job_error(self, job: Job) -> str:
        assert job.error is not None
        error = python_error(job.error)
        control = job.control
        if isinstance(control, GroupedJobs) and control.stopped():
            error = (
                "the SparkContext stopped during training: the driver's JVM exits this way"
                " when it runs out of memory (raise spark.driver.memory, now"
                f" {driver_memory(control.context)})\n{error}"
            )
        return error

    def _probe_servers(self) -> None:
        assert self.servers is not None  # workers_seen starts true without servers
        timeout = self.config.request_timeout
        table = fetch_state(self.servers.primaries, self.secret, timeout)[1]
        self.last_probe = time.monotonic()
        self.workers_seen = any(w["incarnation"] >= 0 for w in table["workers"].values())
        if not self.workers_seen and self.last_probe - self.started > timeout:
            raise WorkerFailed(
                f"no Spark task reached the parameter servers within {timeout:g} s of the"
                " training job's start; see the Spark UI or driver log for why its tasks did"
                " not run"
            )


def _exit(error: str) -> Exit:
    """The end of the run: Spark has retried what it would."""
    return Exit(rank=0, exitcode=None, error=error, final=True)


__all__ = ["SparkWorkers"]
