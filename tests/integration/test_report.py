"""A picture of one run: the learning rate in the workers' records and TensorBoard, the
report.png a run draws with report=True, and `ember report RUN`, which draws any run's."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

import ember
from ember.metrics import read_records
from ember.metrics.records import WorkerProgress

pytestmark = pytest.mark.timeout(120)
PNG = b"\x89PNG\r\n\x1a\n"


def test_a_cosine_schedule_shows_in_the_records_tensorboard_and_the_report(
    tmp_path: Path,
) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    result = ember.fit(
        data="digits", strategy="single", epochs=2, lr=0.05, scheduler="cosine",
        log_every=10, tensorboard=True, report=True, out=str(out),
    )  # fmt: skip
    progress = [r for r in read_records(out / "metrics.jsonl") if isinstance(r, WorkerProgress)]
    total = progress[-1].step
    for record in progress:  # the rate its last step ran at: cosine to 0 over the run
        expected = 0.05 * 0.5 * (1 + math.cos(math.pi * (record.step - 1) / total))
        assert record.lr == pytest.approx(expected, rel=1e-6, abs=1e-9)
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert "worker/0/lr" in scalars and "eval/0/test_accuracy" in scalars
    assert "eval/0/test_rows" not in scalars  # how many rows were scored is not a curve
    report = out / "report.png"
    assert report.read_bytes()[:8] == PNG
    report.unlink()
    drawn = subprocess.run(
        [sys.executable, "-m", "ember", "report", str(result.run_dir)],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert drawn.returncode == 0, drawn.stderr
    assert drawn.stdout.strip() == str(report) and report.read_bytes()[:8] == PNG


def test_a_folder_that_is_no_run_is_one_error(tmp_path: Path) -> None:
    drawn = subprocess.run(
        [sys.executable, "-m", "ember", "report", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert drawn.returncode == 2
    assert (
        drawn.stderr.strip() == f"ember: error: {tmp_path}: not a run directory (no metrics.jsonl)"
    )


def test_report_without_matplotlib_is_refused_before_the_run_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    from ember.errors import ConfigError

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else real(name, *a),
    )
    with pytest.raises(
        ConfigError, match=r"report needs matplotlib: pip install 'ember\[report\]'"
    ):
        ember.fit(data="digits", strategy="single", epochs=1, report=True, out=str(tmp_path / "r"))
    assert not (tmp_path / "r").exists()
