"""`ember train --data-mode stream` end to end on the local engine: the same Parquet data
streamed and held in memory, the rows each worker read, and a worker killed mid-epoch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ember.data.generate import generate
from ember.metrics import read_metrics
from tests.processes import has_worker_records, log_of, wait_for

pytestmark = pytest.mark.timeout(240)
ROWS, BATCH = 12_000, 32  # training rows generated; rows a batch


@pytest.fixture(scope="module")
def parquet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data") / "lr"
    written = generate(
        "synthetic-lr", ROWS * (16 * 4 + 8), out, features=16, row_group_bytes=40_000
    )
    assert written.train_rows == ROWS and written.row_groups > 10
    return out


def train(out: Path, data: Path, *flags: str) -> subprocess.Popen[str]:
    args = ["--data", str(data), "--model", "logreg", "--batch-size", str(BATCH)]
    return subprocess.Popen(
        [sys.executable, "-m", "ember", "train", *args, *flags, "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(launcher: subprocess.Popen[str], out: Path) -> dict:
    _, err = launcher.communicate(timeout=200)
    assert launcher.returncode == 0, err
    return json.loads((out / "summary.json").read_text())


def test_streamed_and_in_memory_runs_read_each_shard_once_an_epoch(
    tmp_path: Path, parquet: Path
) -> None:
    flags = ("--workers", "2", "--epochs", "2", "--strategy", "easgd-async", "--lr", "0.1")
    streamed = finished(
        train(tmp_path / "s", parquet, "--data-mode", "stream", *flags), tmp_path / "s"
    )
    memory = finished(
        train(tmp_path / "m", parquet, "--data-mode", "memory", *flags), tmp_path / "m"
    )
    shard = ROWS // 2
    assert streamed["data_mode"] == "stream" and memory["data_mode"] == "memory"
    for rank in ("0", "1"):  # a stream reads its whole shard each epoch
        assert streamed["data_per_worker"][rank]["rows_read"] == 2 * shard
        # rows held in memory are counted as the batches take them: whole batches only
        assert memory["data_per_worker"][rank]["rows_read"] == 2 * (shard // BATCH * BATCH)
    assert streamed["samples"] == memory["samples"] == 2 * 2 * (shard // BATCH * BATCH)
    assert streamed["data_wait_seconds"] > 0 and memory["data_wait_seconds"] > 0
    assert streamed["data_per_worker"]["0"]["peak_rss_bytes"] > 0
    assert abs(streamed["test_accuracy"] - memory["test_accuracy"]) < 0.03


def test_a_streaming_worker_killed_mid_epoch_is_restarted_and_reads_from_its_epoch_on(
    tmp_path: Path, parquet: Path
) -> None:
    out = tmp_path / "run"
    flags = ("--workers", "2", "--epochs", "4", "--strategy", "async", "--log-every", "10")
    launcher = train(out, parquet, "--data-mode", "stream", "--model", "mlp", *flags)
    assert wait_for(lambda: has_worker_records(out), 90)
    victims = [
        p
        for p in psutil.Process(launcher.pid).children(recursive=True)
        if log_of(p).endswith("/logs/worker-1.log")
    ]
    assert victims, "worker 1 was not running"
    victims[0].kill()
    summary = finished(launcher, out)
    records = read_metrics(out / "metrics.jsonl")
    assert summary["worker_restarts"] == 1
    start = next(r for r in records if r["kind"] == "start" and r["incarnation"] == 1)
    done = next(r for r in records if r["kind"] == "done" and r["incarnation"] == 1)
    steps_per_epoch, shard = ROWS // 2 // BATCH, ROWS // 2
    assert 0 < start["first_step"] < start["total_steps"]
    # the resumed epoch is read again from its start (its first batches dropped), the rest whole
    epochs_read = 4 - start["first_step"] // steps_per_epoch
    assert done["rows_read"] == epochs_read * shard
    assert done["steps"] == start["total_steps"] - start["first_step"]


def test_a_regression_streams_its_values_and_scores_as_the_run_in_memory(tmp_path: Path) -> None:
    # y = x . w + 0.1 noise, 8 features, written as train/test Parquet with a float label
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6000, 8)).astype(np.float32)
    y = (x @ rng.normal(size=8) + 0.1 * rng.normal(size=6000)).astype(np.float32)
    data = tmp_path / "regression"
    data.mkdir()
    for name, rows in (("train", slice(0, 5000)), ("test", slice(5000, None))):
        table = pa.table({"features": pa.array(list(x[rows]), pa.list_(pa.float32())),
                          "label": pa.array(y[rows])})  # fmt: skip
        pq.write_table(table, data / f"{name}.parquet", row_group_size=500)
    flags = ("--loss", "mse", "--metrics", "rmse", "--optimizer", "adam", "--lr", "0.05")
    flags += ("--workers", "2", "--epochs", "4", "--strategy", "allreduce")
    summaries = {
        mode: finished(train(tmp_path / mode, data, "--data-mode", mode, *flags), tmp_path / mode)
        for mode in ("stream", "memory")
    }
    streamed, memory = summaries["stream"], summaries["memory"]
    assert streamed["data_mode"] == "stream" and memory["data_mode"] == "memory"
    assert streamed["rows_read"] == 4 * 5000  # every row of both shards, each epoch
    # the labels' spread is about 2.8: a linear model that learned w is near the noise (0.1)
    assert streamed["test_rmse"] < 0.15 and memory["test_rmse"] < 0.15
    assert abs(streamed["test_rmse"] - memory["test_rmse"]) < 0.02
