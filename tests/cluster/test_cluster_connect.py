"""A Spark Connect server on the emulated cluster's master: a client beside it in host 0 fits an
EmberEstimator, whose tasks run on the worker hosts and reach the servers beside the client,
and scores with transform on those hosts."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from ember_lab.emulated import netns
from tests.cluster.runs import RUN_TIMEOUT
from tests.connect_server import ConnectServer, run_client

pytestmark = pytest.mark.timeout(900)
PORT = 15002  # Spark Connect's own default, free in host 0's namespace
ACCURACY = 0.9  # mlp, 3 epochs of easgd-async on 10,000 MNIST images, scored on 2,000


def test_a_connect_client_fits_and_transforms_on_the_cluster(cluster, spark_env, tmp_path) -> None:
    host = netns.address(0)

    def popen(argv: list[str]) -> subprocess.Popen[Any]:
        return cluster.popen(0, argv, env=spark_env, log=tmp_path / "connect.log")

    def reachable() -> bool:
        probe = f"import socket; socket.create_connection(({host!r}, {PORT}), timeout=1).close()"
        return cluster.run(0, [sys.executable, "-c", probe], timeout=30).returncode == 0

    def run(argv: list[str], env: dict[str, str], timeout: float) -> Any:
        return cluster.run(0, argv, env=env, timeout=timeout)

    server = ConnectServer(
        cluster.master_url, host, PORT, tmp_path / "connect.log", popen, reachable,
        conf=["spark.cores.max=2", "spark.dynamicAllocation.enabled=false"],
    )  # fmt: skip
    try:
        result = run_client(server.url, "estimator", tmp_path / "run", RUN_TIMEOUT, spark_env, run)
    finally:
        server.stop()  # its executors hold the workers' cores until its application ends
    assert result["test_accuracy"] >= ACCURACY
    assert result["scored_rows"] == 2000
    assert abs(result["scored_accuracy"] - result["test_accuracy"]) <= 1 / 2000
    spark = result["spark"]
    assert spark["master"] == cluster.master_url
    # the servers listen beside the client and are advertised at the driver host Spark names
    assert spark["bind_address"] == "0.0.0.0" and spark["advertise_address"] == host
    wire = result["wire"]
    assert wire["encrypted"] is True and wire["shared_memory_payloads"] == 0
