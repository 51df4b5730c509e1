"""Shared fixtures: in-process parameter servers on 127.0.0.1, and a check for stray children."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from ember.ps import ParameterServer, ShardSpec, control, make_consistency, shard_ranges
from ember.ps.server import UpdateRule
from ember.wire import curve, use_wire_lanes, wire_lanes
from tests import rogue_peers
from tests.processes import kill_stray_children

SECRET = b"s" * 32
HERE = Path(__file__).parent
# Each suite is a folder, and its folder's name is the mark that selects it (tests/README.md)
SUITES = {
    "unit": "one process, no sockets beyond in-process servers on 127.0.0.1",
    "peers": "the peers' own test scenarios re-created; processes, and the Spark suite's session",
    "integration": "real processes and sockets on 127.0.0.1",
    "spark": "one local[2] SparkSession (and a Spark Connect server) shared by the suite",
    "cluster": "an emulated multi-host Spark cluster in network namespaces; root",
}


def pytest_configure(config: pytest.Config) -> None:
    for suite, what in SUITES.items():
        config.addinivalue_line("markers", f"{suite}: {what}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with its suite, the folder it lives in: `-m "not cluster"`."""
    for item in items:
        folder = item.path.relative_to(HERE).parts[0] if HERE in item.path.parents else ""
        if folder in SUITES:
            item.add_marker(folder)


def on_threads(work: Callable[[int], None], count: int, seconds: float = 30.0) -> None:
    """work(rank) for ranks 0 to count - 1, each on a thread of its own; fails with what
    they raised, or when one has not ended within `seconds`."""
    errors: list[BaseException] = []

    def guarded(rank: int) -> None:
        try:
            work(rank)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(rank,)) for rank in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), f"a worker thread ran past {seconds:g}s"


@contextmanager
def running_servers(
    params: np.ndarray,
    rule: UpdateRule,
    consistency: str = "async",
    shards: int = 1,
    staleness: int = 0,
    buffers_from: int | None = None,
    **kwargs: object,
) -> Iterator[list[ParameterServer]]:
    """Serve `params` split over `shards` servers, each on its own thread; keys from
    `buffers_from` on hold the model's buffers."""
    servers, threads = [], []
    for index, (start, stop) in enumerate(shard_ranges(params.size, shards)):
        server = ParameterServer(
            ShardSpec(index, shards, start, stop, buffers_from),
            params[start:stop],
            rule,
            make_consistency(consistency, staleness),
            SECRET,
            **kwargs,
        )
        thread = threading.Thread(target=server.serve, daemon=True)
        thread.start()
        servers.append(server)
        threads.append(thread)
    try:
        yield servers
    finally:
        for server, thread in zip(servers, threads, strict=True):
            if thread.is_alive():
                control([server.address], SECRET, "stop", timeout=5)
            thread.join(5)


@contextmanager
def endpoint_process(encrypt: bool) -> Iterator[tuple[int, str]]:
    """(pid, address) of a ServerEndpoint with the tests' secret, in a process of its own."""
    with rogue_peers.endpoint_process(encrypt, SECRET) as served:
        yield served


@contextmanager
def transport(encrypt: bool) -> Iterator[None]:
    """This process's endpoints and connections with CURVE or without, as a run's entry
    points set it; the setting is restored afterwards."""
    before = curve.encrypting()
    curve.use_encryption(encrypt)
    try:
        yield
    finally:
        curve.use_encryption(before)


@pytest.fixture
def plain_transport() -> Iterator[None]:
    """The transport of a run with --encrypt off (NULL: no CURVE), for this test."""
    with transport(False):
        yield


@pytest.fixture(autouse=True, scope="session")
def data_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Decoded datasets go to a cache of the session's own, not the user's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EMBER_CACHE_DIR", str(tmp_path_factory.mktemp("ember-cache")))
        yield


@pytest.fixture(autouse=True)
def one_lane() -> Iterator[None]:
    """This process's connections stripe over one socket unless a test says otherwise: a
    probe's choice (--wire-lanes auto) varies with the machine's load. Runs in processes of
    their own keep the run's setting, auto by default."""
    before = wire_lanes()
    use_wire_lanes("1")
    yield
    use_wire_lanes(before)


@pytest.fixture(autouse=True)
def no_stray_children() -> Iterator[None]:
    """Every test must reap what it started; survivors are killed and fail the test."""
    yield
    stray = kill_stray_children()
    assert not stray, f"processes left behind: {stray}"
