"""A diloco run whose period does not fit its steps says so before its first step, on the
terminal and in metrics.jsonl, and its summary says whether the final model collapsed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import ember
from ember.metrics import read_records
from ember.metrics.records import RunEvent

pytestmark = pytest.mark.timeout(120)


def test_a_period_longer_than_the_run_is_warned_of_before_it_trains(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    ember.fit(data="digits", strategy="diloco", workers=2, epochs=1, tau=200, out=str(out))
    err = capfd.readouterr().err
    warned = [line for line in err.splitlines() if line.startswith("ember: warning: diloco")]
    assert len(warned) == 1
    assert "at tau 200 makes 0.4 outer rounds of a worker's 78 steps" in warned[0]
    assert warned[0].endswith("this run is too short for its rounds")
    records = read_records(out / "metrics.jsonl")
    events = [r for r in records if isinstance(r, RunEvent) and r.event == "warning"]
    assert [e.details["text"] for e in events] == [warned[0].removeprefix("ember: warning: ")]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["collapsed"] is False and "collapse" not in summary


def test_a_period_that_fits_the_run_is_not_warned_of(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    ember.fit(data="digits", strategy="diloco", workers=2, epochs=6, tau=50, out=str(tmp_path))
    assert "ember: warning" not in capfd.readouterr().err
