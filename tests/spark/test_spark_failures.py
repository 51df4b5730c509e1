"""A training task's error that no retry can cure ends the Spark job after one attempt, with
its one line."""

from __future__ import annotations

import textwrap

import pytest

import ember.spark
from ember.errors import WorkerFailed
from ember.metrics import read_metrics

pytestmark = pytest.mark.timeout(120)
FACTORY = """
    import math

    from torch import nn


    def net(input_shape, num_classes):
        return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))
"""


def test_a_factory_the_executors_cannot_import_fails_the_stage_once(
    spark, to_frame, digits, tmp_path, monkeypatch
) -> None:
    # importable on the driver alone: the executors' Python workers never had this folder
    (tmp_path / "driver_only").mkdir()
    (tmp_path / "driver_only" / "only_on_the_driver.py").write_text(textwrap.dedent(FACTORY))
    monkeypatch.syspath_prepend(str(tmp_path / "driver_only"))
    frame = to_frame(digits.x_train[:1280], digits.y_train[:1280])
    with pytest.raises(WorkerFailed) as failed:
        ember.spark.fit(
            model="only_on_the_driver:net",
            df=frame,
            test_df=frame,
            strategy="async",
            workers=2,
            epochs=1,
            out=str(tmp_path / "run"),
        )
    first, cause = str(failed.value).split("\n")  # two lines, no traceback
    assert first == "the Spark training job failed (1 attempt(s)):"
    assert cause.startswith("worker ")
    assert (
        ": ConfigError: model factory 'only_on_the_driver:net' cannot be imported: No module"
        " named 'only_on_the_driver'; looked in the working directory"
    ) in cause
    events = [r.get("event") for r in read_metrics(tmp_path / "run" / "metrics.jsonl")]
    assert "stage retry" not in events
