"""--data-mode stream on the Spark engine: each barrier task spills its partition to the
executor's local directory, streams its epochs from there, and leaves nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

import ember.spark
from ember.data.spill import SPILL_PREFIX
from tests.processes import wait_for

pytestmark = pytest.mark.timeout(180)


def local_dirs(spark: Any) -> list[Path]:
    """The local directories Spark hands its Python workers (where spills go)."""
    found = spark.sparkContext.parallelize([0], 1).map(
        lambda _: os.environ.get("SPARK_LOCAL_DIRS", "")
    )
    return [Path(d) for d in found.collect()[0].split(",") if d]


def test_a_streamed_spark_run_trains_reads_its_partitions_and_removes_its_spills(
    spark, digits, to_frame, tmp_path
) -> None:
    result = ember.spark.fit(
        model="mlp",
        df=to_frame(digits.x_train, digits.y_train),
        test_df=to_frame(digits.x_test, digits.y_test),
        strategy="easgd-async",
        workers=2,
        epochs=2,
        data_mode="stream",
        shuffle_buffer=2000,
        out=str(tmp_path / "run"),
    )
    summary = result.summary
    assert summary["data_mode"] == "stream" and summary["test_accuracy"] > 0.85
    for worker in summary["data_per_worker"].values():  # 5,000 rows a partition, each epoch
        assert worker["rows_read"] == 2 * 5000
    dirs = local_dirs(spark)
    assert dirs and all(list(d.glob(f"{SPILL_PREFIX}*")) == [] for d in dirs)


@pytest.mark.parametrize("how", ["raise", "exit"])
def test_a_retried_streaming_stage_leaves_no_spill_of_either_attempt(
    spark, to_frame, digits, tmp_path, monkeypatch, how
) -> None:
    from tests.spark.test_spark_training import FAULTY

    module = tmp_path / f"ember_spill_fails_once_{how}.py"
    module.write_text(f"MARKER = {str(tmp_path / 'failed')!r}\nHOW = {how!r}\n{FAULTY}")
    monkeypatch.syspath_prepend(str(tmp_path))  # the driver builds the model too
    spark.sparkContext.addPyFile(str(module))
    result = ember.spark.fit(
        model=f"ember_spill_fails_once_{how}:make",
        df=to_frame(digits.x_train, digits.y_train),
        test_df=to_frame(digits.x_test, digits.y_test),
        strategy="easgd-async",
        workers=2,
        epochs=1,
        data_mode="stream",
        out=str(tmp_path / "run"),
    )
    assert (tmp_path / "failed").exists()  # the first attempt did fail
    assert result.summary["spark"]["stage_attempts"] >= 2
    assert result.summary["data_mode"] == "stream"
    # "exit" killed a Python worker before it could remove its spill: the retry's spills
    # removed it, and their own went when their tasks ended
    dirs = local_dirs(spark)
    assert all(list(d.glob(f"{SPILL_PREFIX}*")) == [] for d in dirs)


def test_a_parquet_path_streamed_on_spark_is_read_by_spark_not_the_driver(
    spark, tmp_path, monkeypatch
) -> None:
    from ember.data import files
    from ember.data.generate import generate

    data = tmp_path / "lr"
    written = generate("synthetic-lr", 2000 * (16 * 4 + 8), data, features=16,
                       row_group_bytes=20_000)  # fmt: skip
    loaded: list[str] = []
    monkeypatch.setattr(files, "load_parquet", lambda *a, **k: loaded.append(a) or 1 / 0)
    result = ember.fit(
        engine="spark",
        data=str(data),
        data_mode="stream",
        model="logreg",
        workers=2,
        epochs=2,
        lr=0.1,
        out=str(tmp_path / "run"),
    )
    summary = result.summary
    assert loaded == []  # the driver never read the training rows
    assert summary["data_mode"] == "stream" and summary["engine"] == "spark"
    # Spark's partitions of the file, repartitioned to 2 tasks, each read whole each epoch
    assert summary["rows_read"] == 2 * written.train_rows
    assert summary["test_accuracy"] > 0.75


def test_ctrl_c_on_a_streaming_spark_run_leaves_no_spill_and_no_process(tmp_path) -> None:
    # its own driver (a session of its own), so that its executors' local directory is
    # known and Ctrl-C reaches it as in a terminal
    local, out = tmp_path / "local", tmp_path / "run"
    local.mkdir()
    flags = ["--engine", "spark", "--master", "local[2]", "--data", "digits"]
    flags += ["--data-mode", "stream", "--epochs", "500", "--strategy", "easgd-async"]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "ember", "train", *flags, "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SPARK_LOCAL_DIRS": str(local)},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        spilled = lambda: len(list(local.rglob(f"{SPILL_PREFIX}*"))) == 2  # noqa: E731
        assert wait_for(spilled, 150), "the tasks did not spill"
        children = psutil.Process(launcher.pid).children(recursive=True)
        launcher.send_signal(signal.SIGINT)
        _, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 130, err
        _, alive = psutil.wait_procs(children, timeout=15)
        assert alive == []
        assert wait_for(lambda: list(local.rglob(f"{SPILL_PREFIX}*")) == [], 15)
    finally:
        launcher.kill()
        launcher.wait(30)
