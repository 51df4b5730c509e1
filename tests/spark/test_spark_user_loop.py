"""`ember.run` on Spark: the user's loop in each barrier task, rank 0's value back, with the
servers of easgd-async and with allreduce's gloo group; a task killed mid-run is retried."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import ember
from ember.metrics import read_metrics
from tests.integration.test_user_loop import EPOCHS, LR, make_mlp, separable, train

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("strategy", ["easgd-async", "allreduce"])
def test_a_user_loop_trains_in_spark_tasks(spark: Any, tmp_path: Path, strategy: str) -> None:
    model = {"model": make_mlp} if strategy == "easgd-async" else {}  # the servers start from it
    value = ember.run(
        train,
        data=separable(),
        strategy=strategy,
        engine="spark",
        workers=2,
        epochs=EPOCHS,
        optimizer="adamw",
        lr=LR,
        tau=4,
        out=str(tmp_path / "run"),
        **model,
    )
    assert value["rank"] == 0 and value["world"] == 2 and value["accuracy"] >= 0.95
    assert isinstance(value["weight"], torch.Tensor) and value["weight"].shape == (32, 8)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["engine"] == "spark" and summary["user_loop"] and summary["exchanges"] > 0
    # the servers hold make_mlp's 354 parameters; allreduce's launcher has no model of its own
    assert summary["parameters"] == (354 if model else 0)
    reports = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "seen" in r]
    assert sorted({r["rank"] for r in reports}) == [0, 1]
    assert "returned" not in {r["kind"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")}


def test_a_task_killed_mid_run_is_retried_and_resumes_from_the_servers(
    spark: Any, tmp_path: Path
) -> None:
    marker = tmp_path / "killed"
    value = ember.run(
        train,
        30,  # rank 1's Python worker dies at its 30th step, once
        str(marker),
        data=separable(),
        model=make_mlp,
        strategy="easgd-async",
        engine="spark",
        workers=2,
        epochs=EPOCHS,
        optimizer="adamw",
        lr=LR,
        tau=4,
        out=str(tmp_path / "run"),
    )
    assert marker.exists()  # the kill did happen
    assert value["rank"] == 0 and value["accuracy"] >= 0.95
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["spark"]["stage_attempts"] >= 2
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    starts = [r for r in records if r["kind"] == "start"]
    assert {r["rank"] for r in starts} == {0, 1} and all(r["attempt"] >= 1 for r in starts)
    assert max(r["first_step"] for r in starts) > 0  # resumed from the servers, not step 0
