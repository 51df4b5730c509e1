"""Bad input to the Spark engine: one clear error, before any worker or server starts."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import ember.spark
from ember.errors import ConfigError

pytestmark = pytest.mark.timeout(60)

X = np.arange(12, dtype=np.float32).reshape(6, 2)
Y = np.arange(6) % 2


def fit(df: Any, tmp_path: Any, **fields: Any) -> Any:
    return ember.spark.fit(df=df, test_df=df, out=str(tmp_path / "run"), **fields)


def test_a_missing_column_is_named(spark, to_frame, tmp_path) -> None:
    with pytest.raises(ConfigError) as error:
        fit(to_frame(X, Y), tmp_path, features_col="pixels")
    assert str(error.value) == (
        "DataFrame has no features column 'pixels' (columns: features, label)"
    )
    with pytest.raises(ConfigError, match=r"^DataFrame has no label column 'digit' "):
        fit(to_frame(X, Y), tmp_path, label_col="digit")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("rows", "schema", "message"),
    [
        (
            [("a", 0), ("b", 1)],
            "features string, label long",
            "column 'features' must be array<float>, array<double> or a Spark ML vector,"
            " got string",
        ),
        (
            [(["a"], 0), (["b"], 1)],
            "features array<string>, label long",
            "column 'features' must be array<float>, array<double> or a Spark ML vector,"
            " got array<string>",
        ),
        (
            [([1.0], "cat"), ([2.0], "dog")],
            "features array<double>, label string",
            "column 'label' must hold numeric labels or arrays of numbers, got string",
        ),
        (
            [([1.0, 2.0], 0), ([1.0, 2.0, 3.0], 1), ([1.0, 2.0], 1)],
            "features array<double>, label long",
            "column 'features' is ragged: its arrays hold between 2 and 3 values",
        ),
        (
            [([1.0, float("nan")], 0), ([1.0, 2.0], 1)],
            "features array<double>, label long",
            "column 'features' has 1 rows with a null, NaN or Inf value",
        ),
        (
            [([1.0, 2.0], 0.5), ([1.0, 2.0], 1.0)],
            "features array<double>, label double",
            "column 'label' has 1 labels that are not integers >= 0",
        ),
    ],
)
def test_unusable_columns_are_named(spark, tmp_path, rows, schema, message) -> None:
    df = spark.createDataFrame(rows, schema)
    with pytest.raises(ConfigError) as error:
        fit(df, tmp_path, batch_size=1)
    assert str(error.value) == message


def test_more_workers_than_task_slots_is_refused(spark, to_frame, tmp_path) -> None:
    with pytest.raises(ConfigError) as error:
        fit(to_frame(X, Y), tmp_path, workers=3)
    assert str(error.value) == (
        "master 'local[2]' runs 2 task(s) at once, but the barrier stage needs one per worker: 3;"
        " lower workers or use local[3]"
    )


def test_too_few_rows_per_worker_is_refused(spark, to_frame, tmp_path) -> None:
    with pytest.raises(ConfigError) as error:
        fit(to_frame(X, Y), tmp_path)
    assert str(error.value) == (
        "each of 2 workers would train on 3 rows, fewer than one batch of 64;"
        " lower batch_size or workers"
    )


def session_with(master: str, **conf: str) -> Any:
    from pyspark import SparkConf

    settings = SparkConf(loadDefaults=False).setAll(list(conf.items()))
    context = SimpleNamespace(master=master, getConf=lambda: settings)
    return SimpleNamespace(sparkSession=SimpleNamespace(sparkContext=context))


def test_dynamic_allocation_and_clusters_without_enough_slots_are_refused(
    tmp_path, monkeypatch
) -> None:
    from ember.engines.spark import session

    dynamic = session_with("local[2]", **{"spark.dynamicAllocation.enabled": "true"})
    with pytest.raises(ConfigError) as error:
        fit(dynamic, tmp_path)
    assert str(error.value) == (
        "spark.dynamicAllocation.enabled is true, but barrier stages (all workers at once)"
        " do not support dynamic allocation; set it to false"
    )
    monkeypatch.setattr(session, "EXECUTOR_WAIT_SECONDS", 0.5)
    with pytest.raises(ConfigError) as error:
        fit(session_with("spark://h:7077"), tmp_path)
    assert str(error.value).startswith(
        "master 'spark://h:7077' runs 0 task(s) at once (Spark reports no executors, after"
        " waiting 0.5s for executors to register), but the barrier stage needs one per worker: 2"
    )
    two_cpus = session_with("local-cluster[2, 2, 1024]", **{"spark.task.cpus": "2"})
    with pytest.raises(ConfigError, match=r"^master 'local-cluster\[2, 2, 1024\]' runs 2 task"):
        fit(two_cpus, tmp_path, workers=3)


def test_single_is_refused_with_its_reason(tmp_path) -> None:
    with pytest.raises(ConfigError) as error:
        fit(session_with("local[2]"), tmp_path, strategy="single", workers=1)
    assert str(error.value) == (  # in ember.spark.fit's words: a keyword, not a flag
        "strategy 'single' is not supported on engine 'spark': it trains one worker alone,"
        ' with nothing to exchange, so a Spark cluster adds only its start-up; use engine="local",'
        " or a distributed strategy (bsp, ssp, async, easgd, easgd-async, allreduce)"
    )


def test_without_pyspark_the_error_says_what_to_install(tmp_path, monkeypatch) -> None:
    session = session_with("local[2]")
    monkeypatch.setitem(sys.modules, "pyspark", None)  # import pyspark now raises ImportError
    with pytest.raises(ConfigError) as error:
        fit(session, tmp_path)
    assert str(error.value) == "engine 'spark' needs pyspark: pip install 'ember[spark]'"


def test_without_java_the_cli_says_what_to_install(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "PATH")}
    done = subprocess.run(
        [sys.executable, "-m", "ember", "train", "--engine", "spark", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=50,
        env={**env, "PATH": str(tmp_path)},
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "ember: error: engine 'spark' needs a Java runtime (17 or 21) and found none on PATH or"
        " in JAVA_HOME: install one (e.g. apt-get install openjdk-17-jre-headless)"
    )
    assert not list(tmp_path.iterdir())  # nothing loaded, nothing written


def test_too_few_task_slots_on_the_cli_is_refused_before_anything_starts(tmp_path) -> None:
    command = [sys.executable, "-m", "ember", "train", "--engine", "spark", "--workers", "2"]
    done = subprocess.run(
        [*command, "--master", "local[1]", "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "ember: error: master 'local[1]' runs 1 task(s) at once, but the barrier stage needs one"
        " per worker: 2; lower workers or use local[2]"
    )
    assert not (tmp_path / "run").exists()  # nothing loaded, nothing written, no JVM started


def test_too_few_rows_for_the_workers_on_the_cli_is_refused_before_spark_starts(tmp_path) -> None:
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    np.savez(tmp_path / "small.npz", x=x, y=np.arange(20) % 2)
    command = [sys.executable, "-m", "ember", "train", "--engine", "spark", "--workers", "2"]
    done = subprocess.run(
        [*command, "--data", str(tmp_path / "small.npz"), "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"ember: error: data {tmp_path / 'small.npz'}: 18 training rows (besides 2 test rows)"
        " cannot give each of 2 workers one batch of 64 rows (128 rows at least); lower"
        " --workers or --batch-size"
    )
    assert not (tmp_path / "run").exists()  # no JVM started, no run directory
