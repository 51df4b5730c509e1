"""A Spark run reports while its training stage runs, not only when its tasks end."""

from __future__ import annotations

from typing import Any

import pytest

import ember.spark
from ember.engines import progress as progress_module
from ember.engines.spark import watch
from ember.metrics import read_metrics
from ember.metrics.records import Evaluation, Record

pytestmark = pytest.mark.timeout(180)
EPOCHS = 8  # long enough that records sent at each epoch's end arrive before the job's


def test_epoch_records_reach_the_driver_while_the_training_stage_still_runs(
    spark, to_frame, digits, tmp_path, monkeypatch
) -> None:
    jobs: list[Any] = []

    class Watched(watch.Job):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            jobs.append(self)

    seen: list[tuple[str, int | None, bool]] = []  # (kind, epoch, training job still running)
    test_sets: set[str] = set()  # what the evaluations the bar was told say they scored
    update = progress_module.Progress.update

    def spy(self: Any, record: Record) -> None:
        running = bool(jobs) and jobs[-1].thread.is_alive()
        seen.append((record.kind, getattr(record, "epoch", None), running))
        if isinstance(record, Evaluation):
            test_sets.add(str(record.test_set))
        update(self, record)

    monkeypatch.setattr(watch, "Job", Watched)  # where the training job starts
    monkeypatch.setattr(progress_module.Progress, "update", spy)
    ember.spark.fit(
        model="mlp",
        df=to_frame(digits.x_train, digits.y_train),
        test_df=to_frame(digits.x_test, digits.y_test),
        strategy="async",
        workers=2,
        epochs=EPOCHS,
        out=str(tmp_path / "run"),
    )
    # Any epoch's but the last: a task's sender may connect late on a loaded host, and only
    # records that wait for the job's end would fail this.
    live = [epoch for kind, epoch, running in seen if kind == "eval" and running]
    assert any(epoch < EPOCHS for epoch in live), seen
    assert any(kind == "worker" and running for kind, _, running in seen)
    # metrics.jsonl holds the records the tasks returned, each once, not the streamed copies
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["epoch"] for r in records if r.get("kind") == "eval"] == list(range(1, EPOCHS + 1))
    # worker 0's figures come from the 1,000 test rows its task was handed, of digits' 2,000
    assert test_sets == {"subset of 1,000 rows"}
    assert {r["test_set"] for r in records if r.get("kind") == "eval"} == test_sets
