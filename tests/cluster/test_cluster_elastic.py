"""Ray Train's elastic scenario replayed on the emulated standalone cluster: a Spark
application with dynamic allocation trains MNIST with a worker range of 1 to 4 while worker
hosts leave and join under it (4 -> 2 -> 3 members, one host killed outright, one stopped,
one joining); the run finishes with no restart of the survivors and the accuracy of a
fixed-size run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ember_lab.emulated import netns
from ember_lab.emulated.standalone import WORKER
from ember_lab.emulated.system import address, kill_tree, spark_class
from tests.processes import wait_for

pytestmark = pytest.mark.timeout(900)

HERE = Path(__file__).parent
EPOCHS = 12
CHANGE_SECONDS = 150.0  # for a joined host's executor to start its member, on 2 shared cores


def members(out: Path) -> list[int]:
    """The member counts the launcher told of, in order (its `membership` records)."""
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    whole = path.read_text().split("\n")[:-1]  # not a line being written
    return [json.loads(line)["members"] for line in whole if '"event": "membership"' in line]


def join_host(cluster: netns.Cluster, host: int, name: str, logs: Path) -> subprocess.Popen[Any]:
    """One more Spark worker (1 core) in host `host`: a machine joining the cluster."""
    command = [spark_class(), WORKER, "--host", address(host), "--cores", "1", "--memory", "2g"]
    command += ["--work-dir", str(logs / name), cluster.master_url]
    env = cluster.env(host, {"SPARK_LOG_DIR": str(logs), "SPARK_WORKER_DIR": str(logs / name)})
    return cluster.popen(host, command, env=env, log=logs / f"{name}.log")


def test_a_range_trains_on_while_worker_hosts_join_and_leave(
    cluster: netns.Cluster, spark_env: dict[str, str], tmp_path: Path
) -> None:
    out, logs = tmp_path / "run", tmp_path / "hosts"
    logs.mkdir()
    script = str(HERE / "scripts" / "elastic_fit.py")
    driver = cluster.popen(  # its executors start as the hosts below join
        0,
        [sys.executable, script, cluster.master_url, str(out), str(EPOCHS)],
        env=spark_env,
        log=tmp_path / "driver.log",
    )
    # two more hosts (a second worker in hosts 1 and 2): 4 slots for the range's 4 members
    joined = [join_host(cluster, 1, "joined-1", logs), join_host(cluster, 2, "joined-2", logs)]
    # the same run at a fixed size, on this host, meanwhile: the cluster's run waits on JVMs
    # and executors starting more than it computes
    fixed = subprocess.Popen(fixed_argv(tmp_path / "fixed"), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    told = lambda n: lambda: n in members(out)[-1:] or driver.poll() is not None  # noqa: E731
    try:
        assert wait_for(told(4), 300), f"never 4 members: {members(out)}"
        kill_tree([joined[0].pid])  # killed outright, its executor and member with it
        os.killpg(joined[1].pid, signal.SIGTERM)  # stopped: it stops its executor
        # a host joins again at once: its member starts long after the two lost ones are out
        joined.append(join_host(cluster, 2, "joined-3", logs))
        assert wait_for(told(3), CHANGE_SECONDS), f"never 3 members: {members(out)}"
        assert driver.wait(600) == 0, (tmp_path / "driver.log").read_text()[-4000:]
        _, err = fixed.communicate(timeout=600)
        assert fixed.returncode == 0, err[-3000:]
    finally:
        kill_tree([p.pid for p in (driver, fixed, *joined) if p.poll() is None])
    told_counts = members(out)
    summary = json.loads((out / "summary.json").read_text())
    # the changes, as the launcher told of them: 4 in, then 2, then 3
    after = told_counts[told_counts.index(4) :]
    assert 2 in after and 3 in after[after.index(2) :], told_counts
    # each incarnation (a task attempt) registered once with the servers
    events = summary["server"]["events"]
    registered = Counter(e["worker"] for e in events if e["event"] == "register")
    assert set(registered) == {0, 1, 2, 3}, events
    once = sorted(registered.values())
    assert once[:2] == [1, 1]  # the two on the hosts that stayed never restarted
    assert once[-1] >= 2  # a lost host's member was retried, alone
    assert summary["spark"]["stage_attempts"] == 1
    assert summary["epoch_rows"] == [summary["epoch_rows"][0]] * EPOCHS
    assert summary["pieces_reissued"] >= 1
    reference = json.loads((tmp_path / "fixed" / "summary.json").read_text())
    accuracy = (summary["test_accuracy"], reference["test_accuracy"])
    assert abs(accuracy[0] - accuracy[1]) <= 0.005, accuracy


def fixed_argv(out: Path) -> list[str]:
    """The same training at a fixed size, the range's MAX of 4 workers, on this host's
    local engine."""
    argv = [sys.executable, "-m", "ember", "train", "--data", "mnist", "--strategy", "async"]
    return [*argv, "--lr", "0.02", "--workers", "4", "--epochs", str(EPOCHS), "--out", str(out)]
