"""The Spark engine's addresses: a task that cannot reach the servers fails at once naming
what it tried, and --ports confines what the run listens on; a top-level spark-submit style
script (no main guard) trains, since the servers are fresh interpreters."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import ember.spark
from ember.errors import WorkerFailed

pytestmark = pytest.mark.timeout(240)


def test_a_wrong_advertise_address_fails_at_once_naming_the_address(
    spark, digits, to_frame, tmp_path
) -> None:
    started = time.monotonic()
    with pytest.raises(WorkerFailed) as error:
        ember.spark.fit(
            df=to_frame(digits.x_train, digits.y_train),
            test_df=to_frame(digits.x_test, digits.y_test),
            workers=2,
            epochs=1,
            advertise_address="127.0.0.2",  # loopback, where nothing of this run listens
            request_timeout=3600.0,  # what a worker would otherwise wait for each server
            out=str(tmp_path / "run"),
        )
    assert time.monotonic() - started < 600  # far short of the request timeout
    lines = str(error.value).splitlines()
    assert lines[0].startswith("the Spark training job failed (")
    assert len(lines) == 2, str(error.value)  # the task's one line, no traceback
    assert re.fullmatch(
        r"the training task on \S+ \(127\.0\.0\.1\) cannot reach the parameter server at"
        r" 127\.0\.0\.2 port \d+: Connection refused\. Check --advertise-address \(what tasks are"
        r" told the driver is at\), that no firewall between this host and the driver drops the"
        r" port, and --ports",
        lines[1],
    ), lines[1]


def test_every_listener_of_the_run_takes_its_port_from_the_range(
    spark, digits, to_frame, tmp_path
) -> None:
    low, high = 47310, 47319
    result = ember.spark.fit(
        df=to_frame(digits.x_train, digits.y_train),
        test_df=to_frame(digits.x_test, digits.y_test),
        strategy="async",
        workers=2,
        epochs=1,
        servers=2,
        replicas=2,
        ports=f"{low}-{high}",
        out=str(tmp_path / "run"),
    )
    about = result.summary["spark"]
    assert about["ports"] == f"{low}-{high}" and about["advertise_address"] == "127.0.0.1"
    ports = [int(about["record_collector"].rsplit(":", 1)[1])]
    for log in sorted((tmp_path / "run" / "logs").glob("server-*.log")):
        ports += [int(p) for p in re.findall(r"at tcp://127\.0\.0\.1:(\d+)", log.read_text())]
    assert len(ports) == 5 and len(set(ports)) == 5  # 2 shards x 2 replicas, the collector
    assert all(low <= port <= high for port in ports), ports


SCRIPT = """
from pyspark.sql import SparkSession

import ember.spark
from ember.data import load_dataset

spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
digits = load_dataset("digits")
rows = [(x.reshape(-1).tolist(), int(y)) for x, y in zip(digits.x_train, digits.y_train)]
df = spark.createDataFrame(rows, "features array<float>, label long")
result = ember.spark.fit(df=df, workers=2, epochs=2, out=OUT)
print("accuracy", result.summary["test_accuracy"])
spark.stop()
"""


def test_a_top_level_script_without_a_main_guard_trains(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT).replace("OUT", repr(str(tmp_path / "run"))))
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=200,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout.split("accuracy")[-1]) > 0.8
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["engine"] == "spark" and summary["workers"] == 2
