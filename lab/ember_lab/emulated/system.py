"""The machine's side of the emulated hosts: what building them needs, one ip/tc command, the
namespaces and the processes inside them, and removing what a harness that died left behind.
netns.py builds the hosts on these (its docstring has the layout)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import psutil

SWITCH = "ember-sw"
SUBNET = "198.18.0.0/24"
PREFIX = "ember-h"
LOCK = Path("/run/ember-cluster.lock")
STATE = Path("/run/ember-cluster.json")  # what a crashed harness left, for the next to remove
COMMAND_TIMEOUT = 30.0  # seconds for one ip/tc command
KILL_TIMEOUT = 10.0


class ClusterError(RuntimeError):
    """The emulated cluster could not be built, or another one is running."""


def available() -> str | None:
    """Why a cluster cannot be built here, or None when it can."""
    if not sys.platform.startswith("linux"):
        return "the emulated cluster needs Linux network namespaces"
    if os.geteuid() != 0:
        return "the emulated cluster needs root (network namespaces, veths, a bridge)"
    if shutil.which("ip") is None:
        return "the emulated cluster needs iproute2 (`ip`)"
    return None


def spark_available() -> str | None:
    """Why a Spark standalone cluster cannot start here, or None."""
    if shutil.which("java") is None:
        return "the Spark cluster needs a Java runtime (`java`)"
    try:
        spark_class()
    except ClusterError as error:
        return str(error)
    return None


def spark_class() -> str:
    # found, not imported: the daemons are started from pyspark's scripts, never its Python
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise ClusterError("the Spark cluster needs pyspark: pip install -e '.[spark]'")
    path = Path(spec.origin).parent / "bin" / "spark-class"
    if not path.exists():
        raise ClusterError(f"pyspark has no {path}")
    return str(path)


def address(host: int) -> str:
    return f"198.18.0.{10 + host}"


def namespace(host: int) -> str:
    return f"{PREFIX}{host}"


def ip(*args: str, check: bool = True) -> str:
    """One iproute2/tc command (`ip netns exec ...` included); its stdout."""
    done = subprocess.run(args, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
    if check and done.returncode != 0:
        raise ClusterError(f"`{' '.join(args)}` failed: {done.stderr.strip()}")
    return done.stdout


def namespaces() -> list[str]:
    """This harness's namespaces that exist now."""
    names = [line.split()[0] for line in ip("ip", "netns", "list").splitlines() if line.strip()]
    return [n for n in names if n == SWITCH or re.fullmatch(rf"{PREFIX}\d+", n)]


def pids_in(name: str) -> list[int]:
    """Every process living in a namespace."""
    return [int(pid) for pid in ip("ip", "netns", "pids", name, check=False).split()]


def kill_tree(pids: Sequence[int]) -> None:
    """SIGKILL these processes and all their descendants, and wait (bounded) until they are gone."""
    doomed: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            root = psutil.Process(pid)
            for process in [root, *root.children(recursive=True)]:
                doomed[process.pid] = process
        except psutil.Error:
            continue
    for process in doomed.values():
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(list(doomed.values()), timeout=KILL_TIMEOUT)


def blackhole_exists() -> bool:
    return bool(ip("ip", "route", "show", "exact", SUBNET, "type", "blackhole").strip())


def remove_leftovers() -> None:
    """Remove what a harness that died without tearing down left: call with the lock held."""
    state = json.loads(STATE.read_text()) if STATE.exists() else {}
    for name in namespaces():
        kill_tree(pids_in(name))
        ip("ip", "netns", "del", name)
    if state.get("route_added") and blackhole_exists():
        ip("ip", "route", "del", "blackhole", SUBNET)
    STATE.unlink(missing_ok=True)
