"""A run of a worker range (--workers MIN:MAX): members join and leave while it goes on, the
servers count them, and a strategy whose members cannot change refuses a range up front."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ember
from ember.errors import ConfigError
from ember.metrics import read_metrics
from tests.processes import has_worker_records, wait_for


def ember_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "ember", *args]


def launch(out: Path, *flags: str) -> subprocess.Popen[str]:
    """`ember train` on digits with `flags`, records every 10 steps, into `out`."""
    return subprocess.Popen(
        ember_cli("train", "--data", "digits", *flags, "--log-every", "10", "--out", str(out)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def members_named(out: Path) -> set[str] | None:
    """The ranks members.json names, None once the run has removed it."""
    try:
        return set(json.loads((out / "members.json").read_text())["pids"])
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def members_told(out: Path) -> int | None:
    """The members the launcher last told of (a `membership` record), None before any."""
    if not (out / "metrics.jsonl").exists():
        return None
    whole = (out / "metrics.jsonl").read_text().split("\n")[:-1]  # not a line being written
    told = [json.loads(line) for line in whole if '"event": "membership"' in line]
    return told[-1]["members"] if told else None


def test_a_bsp_range_run_takes_joiners_into_its_rounds_and_counts_them(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run = launch(out, "--strategy", "bsp", "--workers", "1:3", "--epochs", "30")
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
        assert "left the run after " in stdout  # when the run's rows were all dealt
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["workers_min"], summary["workers_max"]) == (1, 3)
    assert (summary["joins"], summary["leaves"]) == (2, 2)
    # the joiners took the run's pieces, not a pass of their own: every row once an epoch
    assert summary["epoch_rows"] == [summary["epoch_rows"][0]] * 30
    assert summary["rows_trained_twice"] == 0
    # the launcher told of the changes as the servers saw them
    told = [r for r in read_metrics(out / "metrics.jsonl") if r.get("event") == "membership"]
    assert told and told[-1]["joins"] == 2  # the leaves come as the rows run out, at the end
    assert "joined, " in err and " left so far)" in err
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


def test_a_member_asked_to_leave_goes_and_the_others_finish_the_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    # batches of 16: 625 an epoch, dealt in pieces of 16 (a leaver ends its piece first)
    flags = ("--strategy", "easgd-async", "--workers", "2:3", "--batch-size", "16")
    run = launch(out, *flags, "--epochs", "20")
    try:
        assert wait_for(lambda: members_told(out) == 2, 90), "the launcher never told of 2"
        assert (out / "members.json").stat().st_mode & 0o777 == 0o600
        left = subprocess.run(
            ember_cli("leave", str(out), "--worker", "1"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert left.returncode == 0, left.stderr
        assert "asked worker 1 (pid " in left.stdout
        # gone, the leaver is no longer named to `ember leave` while the run goes on
        assert wait_for(lambda: members_named(out) == {"0"}, 30), members_named(out)
        _, err = run.communicate(timeout=180)
    finally:
        run.kill()
    assert run.returncode == 0, err
    summary = json.loads((out / "summary.json").read_text())
    records = read_metrics(out / "metrics.jsonl")
    done = {r["rank"]: r for r in records if r.get("kind") == "done"}
    assert done[1]["left"] is True and "left" not in done[0]  # 0 trained to the end
    assert done[1]["steps"] < done[0]["steps"]
    assert not any(r.get("kind") == "restart" for r in records)  # nobody was restarted
    assert {r["incarnation"] for r in records if r.get("kind") == "start"} == {0}
    assert (summary["joins"], summary["leaves"]) == (0, 1)
    assert members_told(out) == 1  # the launcher told of the leave as the servers saw it
    assert summary["pieces_per_epoch"] == 39  # 10,000 rows // (16 x 16)
    assert summary["epoch_rows"] == [10_000] * 20  # every row once, the leaver's included
    assert (summary["rows_trained_twice"], summary["pieces_reissued"]) == (0, 0)
    assert summary["test_accuracy"] > 0.9
    assert not (out / "members.json").exists()  # a finished run has no members to ask


def test_leaving_a_run_that_is_not_a_running_range_is_a_clear_error(tmp_path: Path) -> None:
    done = subprocess.run(
        ember_cli("leave", str(tmp_path), "--worker", "0"), capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "the run is not running, or not of a worker range" in done.stderr
    (tmp_path / "members.json").write_text('{"pids": {"0": 1}}')
    done = subprocess.run(
        ember_cli("leave", str(tmp_path), "--worker", "3"), capture_output=True, text=True
    )
    assert "has no worker 3 (its workers: 0)" in done.stderr
    done = subprocess.run(
        ember_cli("leave", str(tmp_path), "--worker", "0"), capture_output=True, text=True
    )
    assert "worker 0 of the run at" in done.stderr and "is not running (pid 1)" in done.stderr


def write_digits_parquet(folder: Path, group: int) -> None:
    """digits as train.parquet and test.parquet, in row groups of `group` rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ember.data.datasets import load_dataset

    digits = load_dataset("digits")
    folder.mkdir()
    for name, x, y in (
        ("train", digits.x_train, digits.y_train),
        ("test", digits.x_test, digits.y_test),
    ):
        flat = pa.array(list(x.reshape(len(x), -1)), pa.list_(pa.float32()))
        table = pa.table({"features": flat, "label": pa.array(y)})
        pq.write_table(table, folder / f"{name}.parquet", row_group_size=group)


def test_a_joiner_of_a_streamed_range_reads_the_files_and_cuts_them_as_the_members(
    tmp_path: Path,
) -> None:
    """The launcher's members stream a copy decoded once into .npy; the joiner plans the
    Parquet files itself. Both deal by the files' row groups, so the servers take the
    joiner's pieces as the run's and every row is trained once an epoch."""
    write_digits_parquet(tmp_path / "digits", group=97)
    out = tmp_path / "run"
    data = ("--data", str(tmp_path / "digits"), "--data-mode", "stream")
    flags = ("--strategy", "async", "--workers", "1:2", "--epochs", "40")
    run = subprocess.Popen(
        ember_cli("train", *data, *flags, "--log-every", "10", "--out", str(out)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_for(lambda: has_worker_records(out), 90), "no worker reported progress"
        joiner = subprocess.run(
            ember_cli("join", str(out), "--epochs", "1"),
            capture_output=True,
            text=True,
            timeout=120,
        )
        _, err = run.communicate(timeout=180)
    finally:
        run.kill()
    assert run.returncode == 0, err
    assert joiner.returncode == 0, joiner.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["joins"] == 1
    assert summary["epoch_rows"] == [summary["epoch_rows"][0]] * 40
    assert summary["rows_trained_twice"] == 0
    steps = re.search(r"left the run after (\d+) steps", joiner.stdout)
    assert steps and int(steps[1]) > 0, joiner.stdout  # it trained pieces of the run
    assert summary["test_accuracy"] > 0.85
