"""A Spark training job whose tasks never reach the parameter servers ends with an error."""

from __future__ import annotations

import time
from typing import Any

import pytest

import ember.engines.spark.driver as spark_engine
import ember.spark
from ember.errors import WorkerFailed

pytestmark = pytest.mark.timeout(120)


def test_a_job_whose_tasks_never_reach_the_servers_ends_after_request_timeout(
    spark, to_frame, digits, tmp_path, monkeypatch
) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    flag = str(tmp_path / "stall")

    def features_that_stall(values):  # runs in Spark's Python workers; no hints, so a plain UDF
        import os
        import time

        if os.path.exists(flag):  # only once training starts: the column checks pass first
            time.sleep(600)
        return values

    stall = F.udf(features_that_stall, T.ArrayType(T.FloatType()))
    x, y = digits.x_train[:2000], digits.y_train[:2000]
    df = to_frame(x, y).withColumn("features", stall("features"))
    prepare = spark_engine._prepare

    def prepare_then_stall(*args: Any) -> Any:
        open(flag, "w").close()
        return prepare(*args)

    monkeypatch.setattr(spark_engine, "_prepare", prepare_then_stall)
    started = time.monotonic()
    with pytest.raises(WorkerFailed) as error:
        ember.spark.fit(
            df=df,
            test_df=to_frame(x[:200], y[:200]),
            out=str(tmp_path / "run"),
            epochs=1,
            worker_timeout=5,
            request_timeout=6,
        )
    assert str(error.value) == (
        "no Spark task reached the parameter servers within 6 s of the training job's start;"
        " see the Spark UI or driver log for why its tasks did not run"
    )
    assert time.monotonic() - started < 60
    # the session is left able to run the next job: the stalled tasks were cancelled
    assert spark.range(4).count() == 4
