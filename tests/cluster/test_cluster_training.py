"""ember trains on a Spark standalone cluster of two worker hosts, with the driver and its
parameter servers on host 0: from the CLI, from a top-level spark-submit script on Parquet, and
through a lost executor."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ember.metrics import read_metrics
from ember_lab.emulated import netns
from tests.cluster.runs import RUN_TIMEOUT, start_training, summary, train, wait_for_steps
from tests.processes import wait_for

pytestmark = pytest.mark.timeout(900)
SCRIPTS = Path(__file__).parent / "scripts"
ACCURACY = 0.97


def crossed_the_network_encrypted(result: dict[str, Any]) -> None:
    assert result["wire"]["encrypted"] is True
    assert result["wire"]["shared_memory_payloads"] == 0  # hosts 1 and 2 cannot map host 0's
    assert result["bytes_pushed"] > 0


def test_the_cli_trains_mnist_on_two_worker_hosts_under_bsp(cluster, spark_env, tmp_path) -> None:
    """easgd-async's run through the command line is the lost executor's, below."""
    out = tmp_path / "run"
    done = train(cluster, spark_env, out, "--epochs", "3", "--strategy", "bsp")
    assert done.returncode == 0, done.stderr[-4000:]
    result = summary(out)
    assert result["engine"] == "spark" and result["config"]["master"] == cluster.master_url
    assert result["test_accuracy"] >= ACCURACY
    crossed_the_network_encrypted(result)


def write_parquet(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    """docs/data.md's layout: `features`, a list of floats per row, and `label`."""
    flat = x.reshape(len(x), -1)
    offsets = np.arange(0, flat.size + 1, flat.shape[1], dtype=np.int32)
    features = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat.reshape(-1)))
    pq.write_table(pa.table({"features": features, "label": y}), path, row_group_size=10_000)


def test_a_top_level_spark_submit_script_trains_from_parquet(cluster, spark_env, tmp_path) -> None:
    from ember.data import load_dataset
    from ember_lab.emulated.netns import spark_class

    mnist = load_dataset("mnist")
    write_parquet(tmp_path / "train.parquet", mnist.x_train, mnist.y_train)
    write_parquet(tmp_path / "test.parquet", mnist.x_test, mnist.y_test)
    submit = str(Path(spark_class()).with_name("spark-submit"))
    paths = [str(tmp_path / name) for name in ("train.parquet", "test.parquet", "run")]
    script = [submit, "--master", cluster.master_url, str(SCRIPTS / "fit_parquet.py"), *paths]
    done = cluster.run(0, script, env=spark_env, timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["engine"] == "spark" and result["test_accuracy"] >= ACCURACY
    crossed_the_network_encrypted(result)


def executor_on(cluster: netns.Cluster, host: int) -> int | None:
    for process in cluster.pids(host):
        try:
            if "CoarseGrainedExecutorBackend" in " ".join(process.cmdline()):
                return process.pid
        except Exception:
            continue
    return None


def test_a_lost_executor_is_relaunched_and_the_retry_resumes_from_the_servers(
    cluster, spark_env, tmp_path
) -> None:
    out = tmp_path / "run"
    run = start_training(cluster, spark_env, out, "--epochs", "3", "--strategy", "easgd-async")
    wait_for_steps(out, run)
    victim = executor_on(cluster, 1)
    assert victim is not None, "no executor JVM on host 1 while the stage runs"
    os.kill(victim, signal.SIGKILL)
    # the worker launches a new executor for the app (and kills it when the app ends)
    relaunched = lambda: executor_on(cluster, 1) not in (None, victim)  # noqa: E731
    assert wait_for(relaunched, 120), "host 1's worker launched no new executor in 120 s"
    assert run.wait(RUN_TIMEOUT) == 0, (out.with_suffix(".log")).read_text()[-4000:]
    result = summary(out)
    assert result["engine"] == "spark" and result["config"]["master"] == cluster.master_url
    assert result["test_accuracy"] >= ACCURACY
    crossed_the_network_encrypted(result)
    assert result["spark"]["stage_attempts"] >= 2
    records = read_metrics(out / "metrics.jsonl")
    assert any(r.get("event") == "stage retry" for r in records)
    retried = [r for r in records if r.get("kind") == "start" and r.get("attempt", 0) >= 1]
    assert {r["rank"] for r in retried} == {0, 1}
    # the retried workers continued from their pushed steps and the servers' center...
    assert max(r["first_step"] for r in retried) > 0
    # ...so their first losses are a trained model's, not the initial weights' (about ln 10 =
    # 2.3 on MNIST's 10 classes; the failed attempt's own records may never reach the driver).
    # The surviving host's old task can run to its last step before Spark stops it, and its
    # retry then resumes with nothing left to train and reports no loss; the lost host's cannot.
    unfinished = {r["rank"] for r in retried if r["first_step"] < r["total_steps"]}
    assert unfinished, retried
    progress = [r for r in records if r.get("kind") == "worker" and r["attempt"] >= 1]
    first = {r["rank"]: r["loss"] for r in reversed(progress)}
    assert set(first) == unfinished and max(first.values()) < 0.5, (first, retried)


def test_allreduce_trains_mnist_across_the_worker_hosts_through_gloo(
    cluster, spark_env, tmp_path
) -> None:
    out = tmp_path / "run"
    done = train(cluster, spark_env, out, "--epochs", "3", "--strategy", "allreduce")
    assert done.returncode == 0, done.stderr[-4000:]
    result = summary(out)
    assert result["strategy"] == "allreduce" and result["servers"] == 0
    assert result["test_accuracy"] >= ACCURACY
    assert result["bytes_pushed"] > 0 and result["bytes_pushed"] == result["bytes_pulled"]
    # rank 0 met the other rank on its own worker host, not on the driver's host 0
    host = result["gloo"]["rendezvous"].rsplit(":", 1)[0]
    assert host in (netns.address(1), netns.address(2)), result["gloo"]
    assert result["gloo"]["gradients_left_the_host_unencrypted"] is True
    assert result["gloo"]["encrypted"] is False and result["wire"]["encrypted"] is False
    assert "gloo (torch.distributed), which neither encrypts nor authenticates" in done.stderr
