"""A worker range on Spark: MAX ordinary tasks (no barrier stage), each a member that trains
the rows the servers deal it; rows handed over in memory are written once as Parquet and
streamed by the members."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ember
import ember.spark
from ember.errors import ConfigError
from ember.metrics import read_metrics

pytestmark = pytest.mark.timeout(180)


def test_a_range_runs_as_ordinary_tasks_that_share_the_dealt_rows(spark, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = ember.fit(
        data="digits", strategy="async", workers=(1, 3), epochs=8, engine="spark", out=str(out)
    )
    summary = result.summary
    assert (summary["workers_min"], summary["workers_max"]) == (1, 3)
    rows = summary["epoch_rows"][0]
    assert rows > 1000 and summary["epoch_rows"] == [rows] * 8
    assert summary["rows_trained_twice"] == 0
    records = read_metrics(out / "metrics.jsonl")
    starts = [r for r in records if r.get("kind") == "start"]
    # three members, one attempt each: local[2] runs two at once, the third when one ends
    assert sorted(r["rank"] for r in starts) == [0, 1, 2]
    done = [r for r in records if r.get("kind") == "done"]
    assert sum(r["samples"] for r in done) == 8 * rows  # every row once an epoch, in all
    assert sum(r["samples"] > 0 for r in done) >= 2  # the members ran side by side
    assert summary["spark"]["stage_attempts"] == 1
    assert summary["test_accuracy"] > 0.85


def test_rows_handed_over_in_memory_are_written_once_and_streamed_by_the_members(
    spark, digits, to_frame, tmp_path: Path
) -> None:
    """Arrays and a DataFrame in a range: the driver writes the training rows as Parquet
    under the run's directory, and each member streams the pieces it is dealt."""
    out = tmp_path / "arrays"
    result = ember.fit(
        data=(digits.x_train, digits.y_train),
        strategy="async",
        workers=(1, 2),
        epochs=4,
        engine="spark",
        out=str(out),
    )
    assert (out / "rows" / "train.parquet").is_file()
    summary = result.summary
    held_out = len(digits.y_train) // 10  # the arrays' test rows, as a run without a range
    assert summary["epoch_rows"] == [len(digits.y_train) - held_out] * 4
    assert summary["rows_trained_twice"] == 0
    done = [r for r in read_metrics(out / "metrics.jsonl") if r.get("kind") == "done"]
    assert done and all(r["data_mode"] == "stream" for r in done)
    assert summary["test_accuracy"] > 0.85

    frame = to_frame(digits.x_train, digits.y_train.astype(np.int64))
    out = tmp_path / "frame"
    fitted = ember.spark.fit(df=frame, strategy="async", workers=(1, 2), epochs=4, out=str(out))
    assert (out / "rows" / "train.parquet").is_dir()  # Spark's part files, where it wrote them
    rows = fitted.summary["epoch_rows"][0]
    assert 0.8 * len(digits.y_train) < rows < len(digits.y_train)  # a tenth held out
    assert fitted.summary["epoch_rows"] == [rows] * 4
    assert fitted.summary["test_accuracy"] > 0.85


def test_a_range_refuses_what_its_members_cannot_stream(spark, digits, to_frame) -> None:
    frame = to_frame(digits.x_train[:200], digits.y_train[:200].astype(np.int64))
    weighted = frame.withColumn("weight", frame["label"] * 0 + 1.0)
    with pytest.raises(ConfigError, match="without weights: give workers=N"):
        ember.spark.fit(df=weighted, weight_col="weight", workers=(1, 2))


def test_an_estimator_with_workers_max_fits_as_a_range(spark, digits, to_frame, tmp_path) -> None:
    """Spark ML's param for a range: workers is its MIN, workersMax its MAX."""
    import json

    frame = to_frame(digits.x_train[:2000], digits.y_train[:2000].astype(np.int64))
    out = tmp_path / "estimator"
    made = ember.spark.EmberEstimator(
        model="mlp", strategy="async", workers=1, epochs=2, runFields={"out": str(out)}
    ).setWorkersMax(2)
    assert made.getWorkersMax() == 2
    model = made.fit(frame)
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["workers_min"], summary["workers_max"]) == (1, 2)
    assert summary["epoch_rows"] == [summary["epoch_rows"][0]] * 2
    scored = model.transform(frame).select("prediction").collect()
    assert len(scored) == 2000


def test_a_range_on_parquet_files_streams_them_in_each_member(spark, digits, tmp_path) -> None:
    """--data-mode stream: no member holds the rows; each reads the files' row groups it
    is dealt, planned from the files where it runs."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "digits"
    folder.mkdir()
    for name, x, y in (
        ("train", digits.x_train, digits.y_train),
        ("test", digits.x_test, digits.y_test),
    ):
        flat = pa.array(list(x.reshape(len(x), -1)), pa.list_(pa.float32()))
        pq.write_table(pa.table({"features": flat, "label": pa.array(y)}),
                       folder / f"{name}.parquet", row_group_size=500)  # fmt: skip
    out = tmp_path / "run"
    result = ember.fit(
        data=str(folder), data_mode="stream", strategy="async", workers=(1, 2), epochs=2,
        engine="spark", out=str(out),
    )  # fmt: skip
    assert result.summary["epoch_rows"] == [len(digits.y_train)] * 2
    done = [r for r in read_metrics(out / "metrics.jsonl") if r.get("kind") == "done"]
    assert done and all(r["data_mode"] == "stream" for r in done)
    assert not (out / "rows").exists()  # the files were read where they are
