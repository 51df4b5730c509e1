"""Multi-host test fixtures: one emulated cluster for the whole session (host 0 runs the Spark
master and the driver, hosts 1 and 2 a worker with one core each), built by
ember_lab.emulated.netns.

Without root, iproute2, Java or pyspark these tests are skipped with the reason; with
EMBER_REQUIRE_CLUSTER=1 (as .ci/run sets) a missing prerequisite fails them instead."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ember_lab.emulated import netns
from tests.processes import kill_stray_children

HERE = Path(__file__).parent
HOSTS = 3
REQUIRE = "EMBER_REQUIRE_CLUSTER"
_cluster: list[netns.Cluster] = []  # the running cluster, for the stray-process check


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "lifecycle: builds its own harness; runs before `cluster`")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The lifecycle tests first among this directory's: they build harnesses of their own,
    which the session's cluster (holding the one lock) would refuse."""
    slots = [i for i, item in enumerate(items) if HERE in item.path.parents]
    mine = [items[i] for i in slots]
    mine.sort(key=lambda item: item.get_closest_marker("lifecycle") is None)
    for slot, item in zip(slots, mine, strict=True):
        items[slot] = item


def missing(reason: str) -> None:
    if os.environ.get(REQUIRE) == "1":
        pytest.fail(f"{REQUIRE}=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[netns.Cluster]:
    reason = netns.available() or netns.spark_available()
    if reason:
        missing(reason)
    logs = tmp_path_factory.mktemp("cluster")
    # each worker host offers one GPU that is not there (scripts/fake_gpus.sh), which tasks
    # get only when their application asks Spark for GPUs
    gpus = str(HERE / "scripts" / "fake_gpus.sh")
    running = netns.Cluster(HOSTS, logs, worker_cores=1, worker_memory="2g", gpu_script=gpus)
    with running:
        _cluster.append(running)
        yield running
    _end_cluster()


def _end_cluster() -> None:
    """Tear the cluster down and check that nothing of it is left: the tests after these
    (tests/integration, tests/unit) let no child process outlive a test."""
    if not _cluster:
        return
    running = _cluster.pop()
    running.close()
    left = netns.namespaces()
    assert not left, f"namespaces left behind by the cluster: {left}"
    alive = [p.pid for p in running.processes if p.poll() is None]
    assert not alive, f"cluster processes left behind: {alive}"


@pytest.fixture
def spark_env(cluster: netns.Cluster) -> dict[str, str]:
    """The driver's environment in host 0: this tree's ember on the path of every process."""
    paths = [str(HERE.parents[1] / "src"), str(HERE.parents[1])]
    current = os.environ.get("PYTHONPATH")
    return cluster.env(
        0, {"PYTHONPATH": os.pathsep.join([*paths, *([current] if current else [])])}
    )


@pytest.fixture(autouse=True)
def no_stray_children(request: pytest.FixtureRequest) -> Iterator[None]:
    """As in tests/conftest.py, but the cluster's processes (the Spark daemons and the executors
    they launch) are the session's to keep; a test's own commands must be gone at its end.
    After the last test here, the cluster goes too."""
    yield
    if request.node is [i for i in request.session.items if HERE in i.path.parents][-1]:
        _end_cluster()
    keep = {p.pid for p in _cluster[0].daemons} if _cluster else set()
    stray = kill_stray_children(keep=keep, keep_under=keep)
    assert not stray, f"processes left behind: {stray}"
