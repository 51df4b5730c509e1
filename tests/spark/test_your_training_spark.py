"""A user's model, loss, optimizer and data of any dtype through `ember.fit` on Spark: the
regression, the Transformer on token ids and the BatchNorm CNN, with easgd-async and bsp."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import ember
from tests.task_models import TinyEncoder, bn_cnn, regression_data, regression_net, reversal_data

pytestmark = pytest.mark.timeout(300)


def _regression() -> dict[str, Any]:
    x, y = regression_data(6000)
    return dict(model=regression_net(), data=(x, y), loss="mse", epochs=6, lr=3e-3)


def _tokens() -> dict[str, Any]:
    return dict(model=TinyEncoder(), data=reversal_data(6000), epochs=12, lr=3e-3)


def _cnn() -> dict[str, Any]:
    return dict(model=bn_cnn, data="digits", epochs=2, lr=1e-3)


TASKS = {"regression": (_regression, "test_r2", 0.8), "tokens": (_tokens, "test_accuracy", 0.95)}
TASKS["bn-cnn"] = (_cnn, "test_accuracy", 0.9)


@pytest.mark.parametrize("strategy", ["easgd-async", "bsp"])
@pytest.mark.parametrize("task", TASKS)
def test_each_task_trains_on_spark(spark, tmp_path: Path, task: str, strategy: str) -> None:
    make, key, least = TASKS[task]
    fields = make()
    tau = {"tau": 4} if strategy == "easgd-async" else {}
    result = ember.fit(
        engine="spark",
        strategy=strategy,
        workers=2,
        optimizer="adamw",
        out=str(tmp_path / "run"),
        **tau,
        **fields,
    )
    assert result.summary[key] >= least, result.summary
