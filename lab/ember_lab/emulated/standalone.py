"""A Spark standalone cluster on the emulated hosts: the master in host 0, one worker in every
other host, each JVM run by `ip netns exec` with SPARK_LOCAL_IP its host's address, so it binds
and advertises that address. Their logs, and the workers' work dirs (where executors log), go to
the cluster's log_dir."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ember_lab.emulated.system import (
    COMMAND_TIMEOUT,
    ClusterError,
    address,
    namespace,
    spark_class,
)

MASTER_PORT = 7077
MASTER_UI_PORT = 8080
SPARK_TIMEOUT = 180.0  # seconds for the master and all workers to be up (3 JVMs on 2 cores)


class Hosts(Protocol):
    """What the Spark daemons need of the emulated cluster (netns.Cluster)."""

    hosts: int
    log_dir: Path
    worker_cores: int
    worker_memory: str
    gpu_script: str | None

    @property
    def master_url(self) -> str: ...

    def env(self, host: int, extra: Mapping[str, str] | None = None) -> dict[str, str]: ...

    def popen(
        self,
        host: int | str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        log: Path | None = None,
        **kwargs: Any,
    ) -> subprocess.Popen[Any]: ...


MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"


def start_standalone(cluster: Hosts) -> list[subprocess.Popen[Any]]:
    """Start the master and the workers; return once all workers are ALIVE (bounded)."""
    logs = cluster.log_dir
    work = logs / "spark-work"
    work.mkdir(exist_ok=True)
    daemon = {"SPARK_LOG_DIR": str(logs), "SPARK_WORKER_DIR": str(work)}
    ports = f"--port {MASTER_PORT} --webui-port {MASTER_UI_PORT}".split()
    jvms = {
        "master": cluster.popen(
            0,
            [spark_class(), MASTER, "--host", address(0), *ports],
            env=cluster.env(0, daemon),
            log=logs / "master.log",
        )
    }
    for host in range(1, cluster.hosts):
        size = f"--cores {cluster.worker_cores} --memory {cluster.worker_memory}".split()
        command = [spark_class(), WORKER, "--host", address(host), *size]
        command += ["--work-dir", str(work / f"h{host}"), cluster.master_url]
        env = cluster.env(host, {**daemon, **_gpu_options(cluster.gpu_script)})
        jvms[f"worker on host {host}"] = cluster.popen(
            host, command, env=env, log=logs / f"worker-h{host}.log"
        )
    deadline = time.monotonic() + SPARK_TIMEOUT
    while (alive := alive_workers()) < cluster.hosts - 1:
        for what, process in jvms.items():
            if process.poll() is not None:
                raise ClusterError(f"the Spark {what} exited with {process.returncode}; see {logs}")
        if time.monotonic() > deadline:
            raise ClusterError(
                f"{alive} of {cluster.hosts - 1} Spark workers ALIVE after {SPARK_TIMEOUT:g}s;"
                f" see {logs}"
            )
        time.sleep(1.0)
    return list(jvms.values())


def _gpu_options(script: str | None) -> dict[str, str]:
    """A worker's GPU resource: one, whose address `script` (Spark's discovery script: it
    prints {"name": "gpu", "addresses": [...]}) reports, so tasks that ask for one get it."""
    if script is None:
        return {}
    options = (
        f"-Dspark.worker.resource.gpu.amount=1 -Dspark.worker.resource.gpu.discoveryScript={script}"
    )
    return {"SPARK_WORKER_OPTS": options}


def master_state() -> dict[str, Any] | None:
    """The master's /json status, fetched from inside host 0; None while it does not answer
    with a whole JSON document."""
    url = f"http://{address(0)}:{MASTER_UI_PORT}/json/"
    fetch = (
        "import sys, urllib.request\n"
        f"sys.stdout.write(urllib.request.urlopen({url!r}, timeout=3).read().decode())"
    )
    done = subprocess.run(
        ["ip", "netns", "exec", namespace(0), sys.executable, "-c", fetch],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
    )
    if done.returncode != 0:
        return None
    try:
        state: dict[str, Any] = json.loads(done.stdout)
    except json.JSONDecodeError:
        # A master still starting its UI can answer with an empty or partial page.
        return None
    return state


def alive_workers() -> int:
    state = master_state()
    if state is None:
        return 0
    return sum(1 for worker in state.get("workers", []) if worker.get("state") == "ALIVE")
