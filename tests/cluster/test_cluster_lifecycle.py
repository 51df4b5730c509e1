"""The harness leaves nothing behind: not when its `with` body raises, not when its process gets
Ctrl-C or SIGTERM, and what a killed harness left is removed by the next one. These run before
the session's cluster starts (conftest orders them first): they need the lock it holds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ember_lab.emulated import netns
from tests.cluster.conftest import missing

pytestmark = [pytest.mark.timeout(120), pytest.mark.lifecycle]
ROOT = Path(__file__).resolve().parents[2]
HARNESS = """
import os, signal, sys, time
from pathlib import Path
from ember_lab.emulated.netns import Cluster
# Ctrl-C as at a terminal: a suite started in the background of a script (`cmd &`) has SIGINT
# ignored, and a child inherits that
signal.signal(signal.SIGINT, signal.default_int_handler)
cluster = Cluster(3, Path(sys.argv[1]), spark=False, rate="100mbit")
with cluster:
    # a process tree inside a host: sh and the sleep it forks
    cluster.popen(1, ["sh", "-c", "sleep 600 & wait"])
    print("up", flush=True)
    if sys.argv[2] == "crash":
        os._exit(1)  # no teardown at all
    time.sleep(600)
"""


@pytest.fixture(autouse=True)
def root_and_iproute2(tmp_path: Path) -> None:
    reason = netns.available()
    if reason:
        missing(reason)
    # A harness killed before this test (a benchmark's, say) may have left its route, which
    # the test's own harness would remove as a leftover: start from a machine without them.
    with netns.Cluster(1, tmp_path / "sweep", spark=False):
        pass


def blackhole() -> bool:
    return bool(netns.ip("ip", "route", "show", "exact", netns.SUBNET, "type", "blackhole"))


def start_harness(tmp_path: Path, how: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    child = subprocess.Popen(
        [sys.executable, "-c", HARNESS, str(tmp_path), how],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "up"
    assert sorted(netns.namespaces()) == ["ember-h0", "ember-h1", "ember-h2", "ember-sw"]
    assert netns.pids_in("ember-h1"), "the host's process tree did not start"
    return child


def sleepers() -> list[int]:
    found = subprocess.run(["pgrep", "-f", "^sleep 600$"], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM])
def test_a_signalled_harness_tears_everything_down(tmp_path, number) -> None:
    before = blackhole()
    child = start_harness(tmp_path, "wait")
    assert blackhole()
    child.send_signal(number)
    child.communicate(timeout=60)
    assert netns.namespaces() == []
    assert blackhole() == before
    assert sleepers() == []


def test_leftovers_of_a_killed_harness_are_removed_by_the_next(tmp_path) -> None:
    before = blackhole()
    child = start_harness(tmp_path, "crash")
    assert child.wait(60) == 1
    assert netns.namespaces(), "the crashed harness should have left its namespaces"
    with netns.Cluster(2, tmp_path / "next", spark=False) as cluster:
        assert sorted(netns.namespaces()) == ["ember-h0", "ember-h1", "ember-sw"]
        assert "tbf" not in cluster.qdiscs(1)  # a new host 1, not the crashed harness's
        assert sleepers() == []
    assert netns.namespaces() == []
    assert blackhole() == before


def test_an_error_in_the_body_tears_down_and_propagates(tmp_path) -> None:
    with pytest.raises(ZeroDivisionError), netns.Cluster(2, tmp_path, spark=False) as cluster:
        cluster.popen(1, ["sleep", "600"])
        raise ZeroDivisionError
    assert netns.namespaces() == []
    assert sleepers() == []
