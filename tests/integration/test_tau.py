"""`ember train --strategy easgd-async --tau auto|loss` end to end on MNIST: real server and
worker processes on 127.0.0.1, the target accuracy reached, and every choice of tau recorded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ember.metrics import read_metrics

pytestmark = pytest.mark.timeout(240)


def train(out: Path, policy: str) -> dict:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ember",
            "train",
            "--data",
            "mnist",
            "--strategy",
            "easgd-async",
            "--workers",
            "2",
            "--epochs",
            "3",
            "--tau",
            policy,
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert done.returncode == 0, done.stderr
    return json.loads((out / "summary.json").read_text())


def tau_records(out: Path) -> dict[int, list[dict]]:
    records: dict[int, list[dict]] = {0: [], 1: []}
    for record in read_metrics(out / "metrics.jsonl"):
        if record["kind"] == "tau":
            records[record["rank"]].append(record)
    return records


@pytest.mark.parametrize("policy", ["auto", "loss"])
def test_an_adaptive_tau_reaches_the_target_and_records_its_choices(tmp_path, policy) -> None:
    out = tmp_path / policy
    summary = train(out, policy)
    assert summary["test_accuracy"] >= 0.97
    assert summary["config"]["tau_policy"] == policy and summary["config"]["tau"] == 8
    assert summary["tau_policy"] == policy
    for rank, records in tau_records(out).items():
        first, *chosen = records
        assert (first["reason"], first["tau"], first["previous"], first["step"]) == (
            "start",
            8,
            None,
            0,
        )
        assert all(r["policy"] == policy and 1 <= r["tau"] <= 256 for r in records)
        for before, after in zip(records, chosen, strict=False):
            assert after["previous"] == before["tau"] and after["step"] >= before["step"]
            assert after["t_comp"] > 0 and after["t_comm"] > 0  # the figures behind it
        final = summary["tau_per_worker"][str(rank)]
        assert final["final"] == records[-1]["tau"] and 1 <= final["median"] <= 256
        if policy == "loss":  # the loss falls, so the second period outlasts the first
            assert chosen and chosen[0]["reason"] == "loss" and chosen[0]["tau"] > 8
            assert chosen[0]["loss"] > chosen[0]["L0"] > 0
        else:
            assert all(r["reason"] == "measured" and r["tau_cover"] >= 1 for r in chosen)


def test_a_fixed_tau_run_sums_up_its_period(tmp_path) -> None:
    flags = ["--data", "digits", "--epochs", "1", "--strategy", "easgd", "--tau", "4"]
    done = subprocess.run(
        [sys.executable, "-m", "ember", "train", *flags, "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["tau_policy"] == "fixed"
    assert summary["tau_per_worker"] == {
        "0": {"final": 4, "median": 4},
        "1": {"final": 4, "median": 4},
    }
    assert tau_records(tmp_path / "run") == {0: [], 1: []}
