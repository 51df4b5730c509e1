"""The emulated cluster itself: Spark tasks run on the worker hosts, links can be shaped, and a
second harness is refused while one runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ember_lab.emulated import netns
from ember_lab.emulated.links import transfer

pytestmark = pytest.mark.timeout(300)
SCRIPTS = Path(__file__).parent / "scripts"


def test_a_pyspark_job_from_host_0_runs_its_tasks_on_hosts_1_and_2(cluster, spark_env) -> None:
    done = cluster.run(
        0,
        [sys.executable, str(SCRIPTS / "where_tasks_run.py"), cluster.master_url, "2"],
        env=spark_env,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"driver": netns.address(0), "tasks": [netns.address(1), netns.address(2)]}


def test_a_second_harness_is_refused_while_one_runs(cluster, tmp_path) -> None:
    with pytest.raises(netns.ClusterError, match="another emulated cluster is running"):
        netns.Cluster(2, tmp_path, spark=False).start()
    assert cluster.alive_workers() == 2  # the refused one touched nothing


def test_a_shaped_link_carries_a_tbf_qdisc_both_ways_and_still_moves_data(cluster) -> None:
    cluster.shape(2, "200mbit")
    try:
        shown = cluster.qdiscs(2)
        assert shown.count("qdisc tbf") == 2 and shown.count("rate 200Mbit") == 2, shown
        shaped = transfer(cluster, 1, 2, 20_000_000)
    finally:
        cluster.shape(2, None)
    assert "tbf" not in cluster.qdiscs(2)
    unshaped = transfer(cluster, 1, 2, 20_000_000)
    assert shaped["bytes"] == unshaped["bytes"] == 20_000_000
    # the figures, for the eye (lab/benchmarks/cluster.py measures links; tests assert no speed)
    print(
        f"\n200mbit link: {shaped['gbit_per_s']:.3f} Gbit/s; unshaped {unshaped['gbit_per_s']:.3f}"
    )
