"""A worker range on Spark: MAX ordinary tasks (no barrier stage), each a member that trains
the rows the servers deal it; rows handed over in memory are refused with the way out."""

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


def test_a_range_of_rows_handed_over_in_memory_is_refused_on_spark(
    spark, digits, to_frame, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="by name or path on each executor"):
        ember.fit(
            data=(digits.x_train, digits.y_train),
            workers=(1, 2),
            engine="spark",
            out=str(tmp_path / "arrays"),
        )
    frame = to_frame(digits.x_train[:200], digits.y_train[:200].astype(np.int64))
    with pytest.raises(ConfigError, match="give workers=N"):
        ember.spark.fit(df=frame, workers=(1, 2), out=str(tmp_path / "frame"))
