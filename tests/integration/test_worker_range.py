"""A run of a worker range (--workers MIN:MAX): members join and leave while it goes on, the
servers count them, and a strategy whose members cannot change refuses a range up front."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import ember
from ember.errors import ConfigError
from tests.processes import has_worker_records, wait_for


def ember_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "ember", *args]


def test_a_bsp_range_run_takes_joiners_into_its_rounds_and_counts_them(tmp_path: Path) -> None:
    out = tmp_path / "run"
    flags = ["--data", "digits", "--strategy", "bsp", "--workers", "1:3", "--epochs", "30"]
    run = subprocess.Popen(
        ember_cli("train", *flags, "--log-every", "10", "--out", str(out)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    joiners: list[subprocess.Popen[str]] = []
    try:
        assert wait_for(lambda: has_worker_records(out), 90), "no worker reported progress"
        for _ in range(2):
            joiners.append(
                subprocess.Popen(
                    ember_cli("join", str(out), "--epochs", "1"),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        left = [joiner.communicate(timeout=120) for joiner in joiners]
        _, err = run.communicate(timeout=180)
    finally:
        for process in (run, *joiners):
            process.kill()
    assert run.returncode == 0, err
    for joiner, (stdout, stderr) in zip(joiners, left, strict=True):
        assert joiner.returncode == 0, stderr
        assert "left the run after 156 steps" in stdout  # 10,000 rows / 64, its own pass
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["workers_min"], summary["workers_max"]) == (1, 3)
    assert (summary["joins"], summary["leaves"]) == (2, 2)
    registered = {e["worker"] for e in summary["server"]["events"] if e["event"] == "register"}
    assert len(registered) == 3 and 0 in registered
    assert summary["test_accuracy"] > 0.9


def test_a_fixed_run_says_its_range_is_its_count(tmp_path: Path) -> None:
    result = ember.fit(
        data="digits", strategy="async", workers=2, epochs=1, out=str(tmp_path / "run")
    )
    summary = result.summary
    assert (summary["workers_min"], summary["workers_max"]) == (2, 2)
    assert (summary["joins"], summary["leaves"]) == (0, 0)


def test_a_strategy_whose_members_cannot_change_refuses_a_range_up_front(tmp_path: Path) -> None:
    done = subprocess.run(
        ember_cli("train", "--strategy", "allreduce", "--workers", "2:4", "--out", str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "strategy 'allreduce' takes a fixed worker count, not the range 2:4" in done.stderr
    assert "its gloo group re-forms only by a restart" in done.stderr
    with pytest.raises(ConfigError, match="the strategies that take a range: async, bsp"):
        ember.fit(data="digits", strategy="allreduce", workers=(2, 4))
    assert not any(tmp_path.iterdir())  # refused before a run directory was made
