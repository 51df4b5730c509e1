"""What crosses the emulated network: only ciphertext unless --encrypt off, nothing served to a
peer without the run's keys, a fast one-line error for a wrong --advertise-address, and every
listening port of the run inside --ports (the encrypted run's)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from ember_lab.emulated import netns
from tests.cluster.packets import Capture, shares_window
from tests.cluster.runs import (
    initial_parameters,
    is_python,
    listening,
    run_tree,
    start_training,
    summary,
    train,
    wait_for_steps,
)
from tests.processes import wait_for

pytestmark = pytest.mark.timeout(900)
SCRIPTS = Path(__file__).parent / "scripts"
CAPTURE_BYTES = 256 << 20  # the first pulls carry the initial vector: well inside this
FLOOD_BYTES = 256 << 20
RSS_GROWTH = 64 << 20


def server_sockets(run: subprocess.Popen[Any]) -> dict[int, list[int]]:
    """pid -> listening ports of the run's Python processes other than the driver itself (its
    parameter servers), in host 0."""
    tree = run_tree(run)
    driver = run.pid
    found: dict[int, list[int]] = {}
    for _, port, pid in listening(0):
        if pid in tree and pid != driver and is_python(tree[pid]):
            found.setdefault(pid, []).append(port)
    return found


def rss(pids: list[int]) -> int:
    return sum(psutil.Process(pid).memory_info().rss for pid in pids)


def test_encrypted_runs_show_no_parameters_serve_no_keyless_peer_and_listen_in_ports(
    cluster, spark_env, tmp_path
) -> None:
    """One run of 2 servers with --ports: ciphertext only on the wire, a keyless flood served
    nothing and costs the servers no memory, and every listening port inside the range."""
    secret = initial_parameters(seed=0).tobytes()
    out, low, high = tmp_path / "run", 47100, 47109
    with Capture(cluster, tmp_path / "frames", seconds=600, max_bytes=CAPTURE_BYTES) as capture:
        flags = ("--epochs", "2", "--encrypt", "on", "--seed", "0", "--servers", "2")
        run = start_training(cluster, spark_env, out, *flags, "--ports", f"{low}-{high}")
        wait_for_steps(out, run)
        ours, everything = _listening_of(run)
        servers: dict[int, list[int]] = {}
        assert wait_for(lambda: bool(servers.update(server_sockets(run)) or servers), 30)
        before = rss(list(servers))
        flood = [sys.executable, str(SCRIPTS / "raw_zmtp.py"), netns.address(0)]
        port = next(iter(servers.values()))[0]
        sent = cluster.run(2, [*flood, str(port), str(FLOOD_BYTES), "50", "30"], timeout=90)
        grown = rss(list(servers)) - before
        assert run.wait(600) == 0, out.with_suffix(".log").read_text()[-4000:]
    attack = json.loads(sent.stdout.strip().splitlines()[-1])
    assert attack["connections"] >= 1
    assert b"READY" not in bytes.fromhex(attack["received"])  # no handshake completed
    assert grown < RSS_GROWTH, f"the server grew {grown >> 20} MiB under a keyless flood"
    assert summary(out)["wire"]["encrypted"] is True
    assert not shares_window(capture.frames(), secret)
    assert len({port for _, port, _ in ours}) >= 3, everything  # 2 servers and the collector
    outside = [entry for entry in ours if not low <= entry[1] <= high]
    assert not outside, f"listening outside {low}-{high}: {outside}"


def test_unencrypted_runs_show_the_parameters_on_the_wire(cluster, spark_env, tmp_path) -> None:
    """The counterpart: the capture and the search do find the vector when it is there."""
    secret = initial_parameters(seed=0).tobytes()
    out = tmp_path / "run"
    with Capture(cluster, tmp_path / "frames", seconds=600, max_bytes=CAPTURE_BYTES) as capture:
        done = train(cluster, spark_env, out, "--epochs", "1", "--encrypt", "off", "--seed", "0")
    assert done.returncode == 0, done.stderr[-4000:]
    assert summary(out)["wire"]["encrypted"] is False
    assert shares_window(capture.frames(), secret)


def test_a_wrong_advertise_address_fails_fast_naming_it(cluster, spark_env, tmp_path) -> None:
    nobody = "198.18.0.99"  # in the subnet, on no host
    started = time.monotonic()
    # were the probe missing, each worker would wait out this --request-timeout: run's timeout
    done = train(
        cluster, spark_env, tmp_path / "run", "--epochs", "1", "--advertise-address", nobody,
        "--request-timeout", "900", timeout=240,
    )  # fmt: skip
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert nobody in last and "--advertise-address" in last, done.stderr[-3000:]
    print(f"\nfailed after {time.monotonic() - started:.1f}s: {last}")


def test_a_port_range_too_small_is_refused_before_anything_starts(
    cluster, spark_env, tmp_path
) -> None:
    apps = len((cluster_state := _state())["completedapps"]) + len(cluster_state["activeapps"])
    done = train(cluster, spark_env, tmp_path / "run", "--ports", "47100-47100", timeout=120)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    # the range's own error, not argparse's about an unknown flag
    assert "47100-47100" in last and "unrecognized" not in last, done.stderr[-3000:]
    after = _state()
    assert len(after["completedapps"]) + len(after["activeapps"]) == apps  # no Spark app ran
    assert not (tmp_path / "run" / "summary.json").exists()


def _listening_of(run: subprocess.Popen[Any]) -> tuple[list[Any], list[Any]]:
    """The run's listening sockets in host 0 that a firewall sees (ember's processes, not the
    driver's JVM, whose ports are Spark's own settings: the servers and the driver's record
    collector; loopback-only listeners are no firewall's business), and every listener."""
    tree = run_tree(run)
    ours = [
        (where, port, pid)
        for where, port, pid in listening(0)
        if pid in tree and is_python(tree[pid]) and not where.startswith("127.")
    ]
    return ours, [(*entry, _name(entry[2])) for entry in listening(0)]


def _name(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline()[:4])
    except psutil.Error:
        return "?"


def _state() -> dict[str, list[object]]:
    from ember_lab.emulated.standalone import master_state

    state = master_state()
    assert state is not None
    return state
