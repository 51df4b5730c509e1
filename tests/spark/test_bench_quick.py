"""`ember bench --quick` end to end, as a user runs it: the files and their fields, not figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ember.config import STRATEGIES

ROW_FIELDS = {
    "kind", "task", "row", "system", "strategy", "engine", "workers", "tau", "sweep", "repeat",
    "status", "error", "target_metric", "target_value", "data", "train_samples", "test_samples",
    "features", "epochs", "iterations", "time_to_target", "samples_to_target",
    "test_accuracy", "test_loss", "samples", "train_seconds", "wall_seconds",
    "samples_per_second", "seconds_per_epoch", "cpu_mean_percent", "cpu_peak_percent",
    "peak_memory_mb", "bytes_per_sample", "t_comp_seconds", "t_comm_seconds", "curve",
    "divergence", "predicted_samples_per_second", "prediction_error", "config", "ember_version",
}  # fmt: skip


@pytest.mark.timeout(900)
def test_quick_bench_writes_a_row_for_mllib_and_every_strategy_a_report_and_plots(
    tmp_path: Path,
) -> None:
    out = tmp_path / "bench"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, "-m", "ember", "bench", "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=840,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    failed = [(r["task"], r["row"], r["error"]) for r in records if r["status"] != "ok"]
    assert not failed, failed
    for record in records:
        assert set(record) >= ROW_FIELDS, ROW_FIELDS - set(record)
    for task in ("lr", "mlp"):
        rows = {r["row"] for r in records if r["task"] == task and not r["sweep"]}
        assert rows == {"mllib", *STRATEGIES}, rows
    swept = sorted(r["tau"] for r in records if r["sweep"])
    assert len(swept) >= 2 and swept[0] < swept[-1]
    for record in records:
        if record["system"] == "ember":
            assert record["predicted_samples_per_second"] > 0
            assert record["config"]["strategy"] == record["strategy"]
        assert record["curve"], record["row"]
        assert record["cpu_peak_percent"] is not None and record["peak_memory_mb"] > 0
    report = (out / "report.md").read_text()
    for label in ("mllib", *STRATEGIES, "Tau sweep", "Model vs measurement"):
        assert label in report
    assert "Link rows were not run: not asked for" in report  # no --hosts given
    wire = report.split("## The wire: plaintext and encrypted")[1].split("\n## ")[0]
    assert all(f"| {name} |" in wire for name in ("plaintext", "curve", "aead")), wire
    plots = sorted(out.glob("*.png"))
    assert len(plots) >= 3, plots
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in plots)
    settings = json.loads((out / "settings.json").read_text())
    assert set(settings["calibration"]) == {"lr", "mlp"}
