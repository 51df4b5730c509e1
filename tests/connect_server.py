"""A Spark Connect server for the tests: the pyspark package's SparkConnectServer run by
spark-submit in the foreground, as a child the tests stop, and a client script run against it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

SERVER = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT = 180.0  # seconds for its JVM to listen, on two cores other tests share
STOP_TIMEOUT = 30.0
CLIENT = Path(__file__).with_name("connect_client.py")
CHECKOUT = Path(__file__).resolve().parents[1]


def checkout_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (this process's environment) with this checkout's ember first on the path, for
    the server's Python workers and for the clients."""
    env = dict(os.environ if base is None else base)
    paths = [str(CHECKOUT / "src"), str(CHECKOUT)]
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
    return env


def spark_submit() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-submit")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def listening(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1.0).close()
        return True
    except OSError:
        return False


class ConnectServer:
    """A Connect server for `master`, listening at host:port only, its output in `log`.
    `popen` starts its command (subprocess.Popen, or an emulated host's), `reachable` says
    whether the port answers from where the clients run."""

    def __init__(
        self,
        master: str,
        host: str,
        port: int,
        log: Path,
        popen: Callable[..., subprocess.Popen[Any]] | None = None,
        reachable: Callable[[], bool] | None = None,
        conf: Sequence[str] = (),
    ) -> None:
        self.url = f"sc://{host}:{port}"
        self.log = log
        settings = {
            "spark.connect.grpc.binding.address": host,
            "spark.connect.grpc.binding.port": str(port),
            "spark.ui.enabled": "false",
            "spark.log.level": "WARN",
            "spark.sql.shuffle.partitions": "2",
        }
        argv = [spark_submit(), "--class", SERVER, "--master", master]
        for key, value in settings.items():
            argv += ["--conf", f"{key}={value}"]
        for setting in conf:
            argv += ["--conf", setting]
        self._reachable = reachable or (lambda: listening(host, port))
        start = popen or self._popen
        self.process = start(argv)
        self._wait()

    def _popen(self, argv: list[str]) -> subprocess.Popen[Any]:
        with self.log.open("ab") as out:
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=checkout_env())

    def _wait(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not self._reachable():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
                raise RuntimeError(f"the Spark Connect server did not start; {self.log}:\n{tail}")
            time.sleep(1.0)

    def stop(self) -> None:
        """SIGTERM (spark-submit execs the JVM, which stops its context and Python workers),
        then SIGKILL if it has not exited in STOP_TIMEOUT seconds."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT)


def run_client(
    url: str,
    what: str,
    out: Path,
    timeout: float,
    env: dict[str, str] | None = None,
    run: Callable[..., subprocess.CompletedProcess[str]] | None = None,
    *args: str,
) -> dict[str, Any]:
    """connect_client.py against `url` in a process of its own (a Connect session turns every
    pyspark call of its process remote); its one JSON line."""
    argv = [sys.executable, str(CLIENT), url, what, str(out), *args]
    env = env or checkout_env()
    if run is None:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    else:
        done = run(argv, env=env, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result
