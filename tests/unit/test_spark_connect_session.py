"""What a run learns and controls of a Spark Connect session without a server: its master and
settings, the task slots it promises, the training job's tag and attempts."""

from __future__ import annotations

from typing import Any

import pytest

from ember.config import RunConfig
from ember.engines.spark import connect
from ember.engines.spark.session import check_cluster, master_of, run_placement
from ember.errors import ConfigError
from ember.metrics.records import Note, RunEvent, WorkerStart


class RuntimeConf:
    def __init__(self, settings: dict[str, str]) -> None:
        self.settings = settings

    def get(self, key: str, default: Any = None) -> Any:
        return self.settings.get(key, default)


class SparkSession:
    """A stand-in for pyspark.sql.connect.session.SparkSession: conf and tags, no SparkContext."""

    def __init__(self, **settings: str) -> None:
        self.conf = RuntimeConf({key.replace("_", "."): v for key, v in settings.items()})
        self.calls: list[tuple[str, str]] = []

    def addTag(self, tag: str) -> None:
        self.calls.append(("add", tag))

    def removeTag(self, tag: str) -> None:
        self.calls.append(("remove", tag))

    def interruptTag(self, tag: str) -> list[str]:
        self.calls.append(("interrupt", tag))
        return []


SparkSession.__module__ = "pyspark.sql.connect.session"


def test_a_connect_session_is_told_apart_by_its_class_not_by_a_spark_context() -> None:
    assert connect.is_connect(SparkSession(spark_master="local[2]"))
    assert not connect.is_connect(RuntimeConf({}))


def test_a_connect_sessions_master_and_placement_come_from_its_settings() -> None:
    local = SparkSession(spark_master="local[2]")
    assert master_of(local) == "local[2]"
    assert run_placement(RunConfig(workers=2), local).advertise == "127.0.0.1"
    cluster = SparkSession(spark_master="spark://198.18.0.10:7077", spark_driver_host="198.18.0.10")
    where = run_placement(RunConfig(workers=2), cluster)
    assert (where.bind, where.advertise) == ("0.0.0.0", "198.18.0.10")


def test_a_local_master_behind_connect_is_refused_with_too_few_slots() -> None:
    with pytest.raises(ConfigError, match=r"master 'local\[2\]' runs 2 task\(s\) at once"):
        check_cluster(RunConfig(workers=3), SparkSession(spark_master="local[2]"))


def test_a_cluster_behind_connect_is_held_to_the_cores_its_settings_promise() -> None:
    url = "spark://198.18.0.10:7077"
    check_cluster(RunConfig(workers=4), SparkSession(spark_master=url))  # nothing promised
    check_cluster(RunConfig(workers=2), SparkSession(spark_master=url, spark_cores_max="2"))
    instances = {"spark_executor_instances": "2", "spark_executor_cores": "2"}
    short = SparkSession(spark_master=url, spark_task_cpus="2", **instances)
    with pytest.raises(ConfigError) as refused:
        check_cluster(RunConfig(workers=3), short)
    assert str(refused.value) == (
        f"master {url!r} runs 2 task(s) at once (the Spark Connect server's spark.cores.max or"
        " spark.executor.instances x spark.executor.cores, over spark.task.cpus), but the"
        " barrier stage needs one per worker: 3; lower workers or give the server's"
        " application more cores"
    )


def test_a_connect_job_is_tagged_cancelled_by_its_tag_and_counts_attempts_by_incarnation() -> None:
    spark = SparkSession(spark_master="local[2]")
    jobs = connect.TaggedJobs(spark)
    jobs.enter("ember training")
    jobs.cancel()
    jobs.leave()
    assert spark.calls == [("add", jobs.tag), ("interrupt", jobs.tag), ("remove", jobs.tag)]
    assert jobs.attempt() == 0
    for rank, incarnation in [(0, 10), (1, 11), (0, 10), (1, 11)]:
        jobs.saw(Note(rank=rank, incarnation=incarnation, text="a worker's"))
    assert jobs.attempt() == 0
    jobs.saw(WorkerStart(rank=1, incarnation=14, first_step=0, total_steps=9))  # a retry
    jobs.saw(RunEvent(event="stage retry"))  # a record of no worker counts for nothing
    assert jobs.attempt() == 1
