"""The one local[2] SparkSession that the Spark suite and the peers' Spark scenarios share
(each folder's conftest.py takes these fixtures from here: one module, one session list), and
the check that only Spark's own processes outlive a test."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.connect_server import ConnectServer
from tests.processes import command_line, kill_stray_children

# Set before the JVM starts: tasks then bind to loopback and run this interpreter.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
HERE = Path(__file__).parent
SUITES = (HERE / "spark", HERE / "peers")  # the suites that share the session
_sessions: list[Any] = []  # the running session, so the last Spark test can end its JVM
_servers: list[ConnectServer] = []  # the running Connect server, ended with it


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("ember-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        # the Spark ML tests train on all of MNIST in this one session: room for its frames
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    if session not in _sessions:  # the peers' suite asks for it too
        _sessions.append(session)
    yield session
    _end_jvm()


def _uses_spark(path: Path) -> bool:
    return any(suite in path.parents for suite in SUITES)


def _end_jvm() -> None:
    """Stop the session and its JVM: tests after these (tests/unit) let no child process
    outlive a test."""
    from ember.engines.spark.session import end_spark

    while _sessions:
        end_spark(_sessions.pop())
    while _servers:
        _servers.pop().stop()


@pytest.fixture(autouse=True)
def no_stray_children(request: pytest.FixtureRequest) -> Iterator[None]:
    """As in tests/conftest.py, but the JVM and the Python workers it forks are Spark's to keep
    between Spark tests; after the last one, the JVM goes too."""
    yield
    if request.node is [i for i in request.session.items if _uses_spark(i.path)][-1]:
        _end_jvm()
    # the JVM forks Python workers as jobs need them, a cancelled job's too: all are Spark's
    jvms = {
        child.pid
        for child in psutil.Process(os.getpid()).children()
        if "org.apache.spark" in " ".join(command_line(child))
    }
    stray = kill_stray_children(keep=jvms, keep_under=jvms)
    assert not stray, f"processes left behind: {stray}"
