"""The fault matrix of the local engine: real `ember train` runs whose children are killed,
stopped or signalled mid-run, and what the run does about it."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ember.metrics import read_metrics
from tests.processes import has_progress, has_worker_records, log_of, wait_for

pytestmark = pytest.mark.timeout(240)
RUN = ["--data", "digits", "--log-every", "10"]


def launch(out: Path, *flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ember", "train", *RUN, *flags, "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def child(launcher: subprocess.Popen[str], log_name: str) -> psutil.Process:
    """The launcher's child that writes logs/<log_name>."""
    for process in psutil.Process(launcher.pid).children(recursive=True):
        if log_of(process).endswith(f"/logs/{log_name}"):
            return process
    raise AssertionError(f"no child writes {log_name}")


def finish(launcher: subprocess.Popen[str], out: Path) -> tuple[dict, list[dict], str]:
    _, err = launcher.communicate(timeout=180)
    assert launcher.returncode == 0, err
    summary = json.loads((out / "summary.json").read_text())
    return summary, read_metrics(out / "metrics.jsonl"), err


def kill_mid_run(
    out: Path, flags: tuple[str, ...], victims: tuple[str, ...], ready=has_worker_records
) -> tuple[dict, list[dict]]:
    """Start a run, SIGKILL the children writing `victims` logs once `ready(out)`, and return
    the summary and metrics of the run, which must succeed."""
    launcher = launch(out, *flags)
    assert wait_for(lambda: ready(out), 90), f"{ready.__name__} never held"
    for name in victims:
        child(launcher, name).kill()
    summary, records, _ = finish(launcher, out)
    return summary, records


def restarts(records: list[dict]) -> list[tuple[int, int]]:
    return [(r["rank"], r["incarnation"]) for r in records if r.get("kind") == "restart"]


@pytest.mark.parametrize("strategy", ["bsp", "ssp", "async", "easgd", "easgd-async"])
def test_a_worker_killed_mid_step_is_restarted_as_a_new_incarnation_and_the_run_finishes(
    tmp_path, strategy
) -> None:
    out = tmp_path / "run"
    summary, records = kill_mid_run(
        out, ("--strategy", strategy, "--epochs", "6"), ("worker-1.log",)
    )
    assert restarts(records) == [(1, 1)]
    assert summary["worker_restarts"] == 1
    again = [r for r in records if r.get("kind") == "start" and r["incarnation"] == 1]
    assert again and again[0]["rank"] == 1  # it registered again and went on from the servers
    assert summary["test_accuracy"] > 0.85


def test_a_killed_allreduce_worker_ends_the_run_naming_it(tmp_path) -> None:
    """All-reduce has no server to rejoin: its process group cannot re-form, so it fails fast."""
    out = tmp_path / "run"
    launcher = launch(out, "--strategy", "allreduce", "--epochs", "30")
    assert wait_for(lambda: has_worker_records(out), 90), "no worker reported progress"
    child(launcher, "worker-1.log").kill()
    killed_at = time.monotonic()
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 1
    assert time.monotonic() - killed_at < 30
    # whichever notices first names itself: worker 1's death, or worker 0's broken all-reduce
    assert "worker 1 exited with code -9" in err or "worker 0 raised" in err
    assert not [r for r in read_metrics(out / "metrics.jsonl") if r.get("kind") == "restart"]


def test_all_workers_killed_at_once_are_restarted_and_the_run_finishes(tmp_path) -> None:
    flags = ("--strategy", "easgd-async", "--epochs", "6")
    summary, records = kill_mid_run(tmp_path / "run", flags, ("worker-0.log", "worker-1.log"))
    assert sorted(restarts(records)) == [(0, 1), (1, 1)]
    assert summary["test_accuracy"] > 0.85


def test_a_killed_primary_fails_over_to_its_replica_and_training_goes_on(tmp_path) -> None:
    flags = ("--strategy", "easgd-async", "--epochs", "8", "--replicas", "2")
    summary, records = kill_mid_run(tmp_path / "run", flags, ("server-0.log",))
    events = [(r["event"], r["server"]) for r in records if r.get("kind") == "server"]
    assert events[:2] == [
        ("promoted", "ember-server-0-replica-1"),
        ("restarted", "ember-server-0"),  # the dead slot comes back as the new backup
    ]
    assert restarts(records) == []  # the workers never noticed more than a slow exchange
    assert summary["test_accuracy"] > 0.85


def test_a_killed_server_without_a_replica_restarts_from_its_newest_checkpoint(tmp_path) -> None:
    flags = ("--strategy", "async", "--epochs", "8", "--checkpoint-seconds", "0.5")
    summary, records = kill_mid_run(tmp_path / "run", flags, ("server-0.log",), has_progress)
    restarted = [r for r in records if r.get("kind") == "server"]
    assert restarted[0]["event"] == "restarted" and restarted[0]["role"] == "primary"
    assert "/checkpoints/step-" in restarted[0]["state_from"]
    assert summary["test_accuracy"] > 0.85


def test_a_stopped_server_that_resumes_lets_training_finish_without_restarts(tmp_path) -> None:
    out = tmp_path / "run"
    launcher = launch(out, "--strategy", "easgd-async", "--epochs", "6")
    assert wait_for(lambda: has_worker_records(out), 90), "no worker reported progress"
    server = child(launcher, "server-0.log")
    server.suspend()
    time.sleep(3)
    server.resume()
    summary, records, _ = finish(launcher, out)
    assert restarts(records) == [] and not [r for r in records if r.get("kind") == "server"]
    assert summary["test_accuracy"] > 0.85


def test_sigterm_writes_a_final_checkpoint_exits_143_and_resume_auto_continues(tmp_path) -> None:
    out = tmp_path / "run"
    flags = ("--strategy", "easgd-async", "--epochs", "30", "--checkpoint-seconds", "600")
    launcher = launch(out, *flags)
    assert wait_for(lambda: has_worker_records(out), 90), "no worker reported progress"
    children = psutil.Process(launcher.pid).children(recursive=True)
    launcher.send_signal(signal.SIGTERM)
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 128 + signal.SIGTERM, err
    assert "interrupted by SIGTERM" in err
    _, alive = psutil.wait_procs(children, timeout=5)
    assert alive == []
    final = [r for r in read_metrics(out / "metrics.jsonl") if r.get("event") == "final checkpoint"]
    assert final, "no final checkpoint was written"  # the only one: the cadence is 600 s
    shorter = ["--epochs", "4", "--out", str(out), "--resume", "auto"]
    resumed = subprocess.run(
        [sys.executable, "-m", "ember", "train", *RUN, *flags[:2], *shorter],
        capture_output=True,
        text=True,
        timeout=180,
        env=os.environ,
    )
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from"] == final[0]["path"]
    # and it said so, where it goes on from, before its first epoch line
    said = re.search(
        r"ember: resuming from (\S+): epoch (\d+) of 4 \(step ([\d,]+) of ([\d,]+)\)",
        resumed.stderr,
    )
    assert said is not None, resumed.stderr
    assert said[1] == final[0]["path"] and int(said[3].replace(",", "")) > 0
    lines = resumed.stderr.splitlines()
    first_epoch = next(i for i, line in enumerate(lines) if line.startswith("epoch "))
    assert lines.index(said[0]) < first_epoch


def test_a_checkpoint_that_hits_a_full_disk_is_reported_and_training_goes_on(
    tmp_path, monkeypatch
) -> None:
    """The launcher saves checkpoints in-process: its first two attempts meet ENOSPC at the
    fsync of the state file; the run reports them, keeps training, and later ones succeed."""
    import errno
    from unittest import mock

    import ember
    from ember.engines import servers as group_module

    real_save, attempts = group_module.save_checkpoint, []

    def on_a_full_disk(*args, **kwargs):
        attempts.append(args[1])
        if len(attempts) > 2:
            return real_save(*args, **kwargs)
        no_space = OSError(errno.ENOSPC, "No space left on device")
        with mock.patch("ember.checkpoint.os.fsync", side_effect=no_space):
            return real_save(*args, **kwargs)

    monkeypatch.setattr(group_module, "save_checkpoint", on_a_full_disk)
    out = tmp_path / "run"
    result = ember.fit(
        data="digits",
        strategy="async",
        epochs=6,
        checkpoint_seconds=0.3,
        log_every=10,
        out=str(out),
    )
    failed = [
        r for r in read_metrics(out / "metrics.jsonl") if r.get("event") == "checkpoint failed"
    ]
    assert len(failed) == 2
    assert all("cannot save (No space left on device)" in r["error"] for r in failed)
    assert len(attempts) > 2  # it went on trying, and the later checkpoints were written
    saved = sorted(p.name for p in (out / "checkpoints").glob("step-*"))
    assert saved and (out / "checkpoints" / "last").read_text().strip() == saved[-1]
    assert result.summary["test_accuracy"] > 0.85


def test_a_worker_joins_a_running_async_run_and_leaves_it_cleanly(tmp_path) -> None:
    out = tmp_path / "run"
    launcher = launch(out, "--strategy", "async", "--epochs", "25")
    assert wait_for(lambda: has_worker_records(out), 90), "no worker reported progress"
    join_file = out / "join.json"
    assert join_file.stat().st_mode & 0o777 == 0o600  # it holds the run's secret
    joined = subprocess.run(
        [sys.executable, "-m", "ember", "join", str(out), "--epochs", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert joined.returncode == 0, joined.stderr
    worker = int(joined.stderr.split("joined as worker ")[1].split()[0])
    assert worker >= 2  # an id of its own, beside the run's workers 0 and 1
    assert f"worker {worker} left the run after 156 steps" in joined.stdout  # 10,000 rows / 64
    summary, _, _ = finish(launcher, out)
    registered = [e for e in summary["server"]["events"] if e["event"] == "register"]
    assert sorted(e["worker"] for e in registered) == [0, 1, worker]
    assert summary["test_accuracy"] > 0.85
    assert not join_file.exists()  # a finished run cannot be joined


def test_joining_a_stopped_run_or_a_damaged_join_file_is_a_clear_error(tmp_path) -> None:
    def join() -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "ember", "join", str(tmp_path)]
        return subprocess.run(command, capture_output=True, text=True, timeout=60)

    joined = join()
    assert joined.returncode == 2
    assert f"{tmp_path}/join.json does not exist: the run is not running" in joined.stderr
    for damaged in ("{not json", '{"servers": []}'):
        (tmp_path / "join.json").write_text(damaged)
        joined = join()
        assert joined.returncode == 2
        assert f"{tmp_path}/join.json is not the join file a run writes" in joined.stderr
        assert "Traceback" not in joined.stderr


def test_a_port_taken_while_its_server_restarts_ends_the_run_naming_the_address(
    tmp_path,
) -> None:
    out = tmp_path / "run"
    launcher = launch(out, "--strategy", "async", "--epochs", "40")
    assert wait_for(lambda: has_worker_records(out), 90), "no worker reported progress"
    log = (out / "logs" / "server-0.log").read_text()
    port = int(log.split("at tcp://127.0.0.1:")[1].split()[0])
    child(launcher, "server-0.log").kill()
    squatter = socket.socket()
    # the dead server's connections linger in TIME_WAIT; only a listener keeps zmq from binding
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        assert wait_for(lambda: _bound(squatter, port), 2), "the dead server's port never freed"
        squatter.listen()
        _, err = launcher.communicate(timeout=120)
    finally:
        squatter.close()
        launcher.kill()
    assert launcher.returncode == 1
    assert "ember-server-0 did not start" in err
    assert f"Address already in use (addr='tcp://127.0.0.1:{port}')" in err


def _bound(sock: socket.socket, port: int) -> bool:
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True
