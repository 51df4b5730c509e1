"""Emulated hosts on this machine: network namespaces on a bridge, and a Spark standalone cluster
over them (docs/cluster.md draws it).

Host i is the namespace `ember-h<i>` with `lo` and one veth, `eth0`, at 198.18.0.(10+i)/24 (RFC
2544's benchmarking range). Every veth's other end, `h<i>`, is a port of the bridge `br0` in the
switch's namespace, `ember-sw`, where a capture sees every frame between hosts. The machine's own
namespace gets a blackhole route for 198.18.0.0/24, so nothing outside reaches those addresses by
mistake. With `rate`, a `tc tbf` qdisc shapes both directions of every host's link (on `eth0`
what it sends, on its bridge port what it receives). With `spark=True`, host 0 runs a standalone
master and every other host one worker, each JVM started by `ip netns exec` with SPARK_LOCAL_IP
its host's address; the driver belongs in host 0 too (`run`/`popen` with `env(0)`).

Teardown (leaving the `with`, an exception, SIGTERM/SIGHUP, Ctrl-C, interpreter exit) kills every
process started here with its whole tree (executor JVMs and their Python workers too), then every
process still inside a namespace, then the namespaces (their veths and the bridge with them) and
the route, if this harness added it. One harness runs at a time (a flock on LOCK); one that finds
leftovers of a crashed harness removes them first.

Needs Linux, root and iproute2 (`available()` says which is missing); Spark needs Java and pyspark.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Any

import psutil

from ember_lab.emulated.standalone import MASTER_PORT, alive_workers, start_standalone
from ember_lab.emulated.system import (
    COMMAND_TIMEOUT,
    KILL_TIMEOUT,
    LOCK,
    PREFIX,
    STATE,
    SUBNET,
    SWITCH,
    ClusterError,
    address,
    available,
    blackhole_exists,
    ip,
    kill_tree,
    namespace,
    namespaces,
    pids_in,
    remove_leftovers,
    spark_available,
    spark_class,
)

BRIDGE = "br0"
BURST_BYTES = 64 << 10  # a shaped link's bucket: a TSO segment fits (smaller ones stall it)

__all__ = [  # the helpers of system.py are used through this module too
    "BURST_BYTES",
    "COMMAND_TIMEOUT",
    "KILL_TIMEOUT",
    "LOCK",
    "PREFIX",
    "STATE",
    "SUBNET",
    "SWITCH",
    "Cluster",
    "ClusterError",
    "address",
    "available",
    "blackhole_exists",
    "ip",
    "kill_tree",
    "namespace",
    "namespaces",
    "pids_in",
    "remove_leftovers",
    "spark_available",
    "spark_class",
]


class Cluster:
    """H emulated hosts, optionally a Spark standalone cluster on them; see the module's doc."""

    def __init__(
        self,
        hosts: int,
        log_dir: Path,
        rate: str | None = None,
        spark: bool = True,
        worker_cores: int = 1,
        worker_memory: str = "2g",
        gpu_script: str | None = None,
    ) -> None:
        if hosts < 1 or hosts > 200:
            raise ClusterError(f"hosts must be 1..200, got {hosts}")
        if spark and hosts < 2:
            raise ClusterError("a Spark cluster needs host 0 for the master and one worker host")
        self.hosts = hosts
        self.log_dir = Path(log_dir)
        self.rate = rate
        self.spark = spark
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        # each worker offers one GPU, at the address this discovery script reports
        self.gpu_script = gpu_script
        self.processes: list[subprocess.Popen[Any]] = []
        self.daemons: list[subprocess.Popen[Any]] = []  # the Spark master and workers
        self._lock: IO[str] | None = None
        self._route_added = False
        self._closed = True
        self._signals: dict[int, Any] = {}
        self._logs: list[IO[bytes]] = []

    # ---- life cycle -----------------------------------------------------------------------------
    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        reason = available() or (spark_available() if self.spark else None)
        if reason:
            raise ClusterError(reason)
        self._take_lock()
        self._closed = False
        atexit.register(self.close)
        self._catch_signals()
        try:
            remove_leftovers()
            self.log_dir.mkdir(parents=True, exist_ok=True)
            self._build_network()
            if self.spark:
                self.daemons = start_standalone(self)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Tear everything down; safe to call twice and from a signal handler's unwinding."""
        if self._closed:
            return
        self._closed = True
        try:
            # only unreaped ones: a reaped pid may belong to another process by now
            kill_tree([p.pid for p in self.processes if p.poll() is None])
            for name in namespaces():  # what escaped the trees (a daemon that re-parented)
                kill_tree(pids_in(name))
            for process in self.processes:
                process.wait(KILL_TIMEOUT)
            for name in namespaces():
                ip("ip", "netns", "del", name)
            if self._route_added and blackhole_exists():
                ip("ip", "route", "del", "blackhole", SUBNET)
            STATE.unlink(missing_ok=True)
        finally:
            for log in self._logs:
                log.close()
            self._restore_signals()
            atexit.unregister(self.close)
            if self._lock is not None:
                self._lock.close()  # releases the flock
                self._lock = None

    def _take_lock(self) -> None:
        LOCK.parent.mkdir(parents=True, exist_ok=True)
        lock = LOCK.open("a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            lock.close()
            raise ClusterError(
                f"another emulated cluster is running (pid {holder} holds {LOCK}); "
                "wait for it to end, or end that process"
            ) from None
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        self._lock = lock

    def _catch_signals(self) -> None:
        """SIGTERM and SIGHUP unwind like Ctrl-C, so `with` and finally blocks tear down."""
        if threading.current_thread() is not threading.main_thread():
            return
        for number in (signal.SIGTERM, signal.SIGHUP):
            self._signals[number] = signal.signal(number, _raise_interrupt)

    def _restore_signals(self) -> None:
        while self._signals:
            number, previous = self._signals.popitem()
            signal.signal(number, previous)

    # ---- the network ----------------------------------------------------------------------------
    def _build_network(self) -> None:
        if not blackhole_exists():
            ip("ip", "route", "add", "blackhole", SUBNET)
            self._route_added = True
        STATE.write_text(json.dumps({"route_added": self._route_added, "pid": os.getpid()}))
        ip("ip", "netns", "add", SWITCH)
        self._in(SWITCH, "ip", "link", "add", BRIDGE, "type", "bridge")
        self._in(SWITCH, "ip", "link", "set", BRIDGE, "up")
        for host in range(self.hosts):
            name, port = namespace(host), f"h{host}"
            ip("ip", "netns", "add", name)
            # both ends are made inside their namespaces: no name is ever taken in the root one
            ip("ip", "link", "add", "eth0", "netns", name, "type", "veth",
               "peer", "name", port, "netns", SWITCH)  # fmt: skip
            self._in(SWITCH, "ip", "link", "set", port, "master", BRIDGE, "up")
            # IPv6 off: no router solicitations or DAD frames in the captures
            self._in(name, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
            self._in(name, "ip", "addr", "add", f"{address(host)}/24", "dev", "eth0")
            self._in(name, "ip", "link", "set", "lo", "up")
            self._in(name, "ip", "link", "set", "eth0", "up")
            if self.rate:
                self.shape(host, self.rate)

    def shape(self, host: int, rate: str | None) -> None:
        """Set host i's link rate both ways (a tc rate such as "1gbit"), or lift it (None)."""
        self._shape(namespace(host), "eth0", rate)
        self._shape(SWITCH, f"h{host}", rate)

    def _shape(self, name: str, device: str, rate: str | None) -> None:
        """A token bucket on a device's egress: `rate`, BURST_BYTES, 50 ms of queue to drop at."""
        if shutil.which("tc") is None:
            raise ClusterError("a link rate needs tc (iproute2)")
        if rate is None:
            delete = f"tc qdisc del dev {device} root".split()
            ip("ip", "netns", "exec", name, *delete, check=False)
            return
        self._in(name, "tc", "qdisc", "replace", "dev", device, "root", "tbf",
                 "rate", rate, "burst", f"{BURST_BYTES >> 10}kb", "latency", "50ms")  # fmt: skip

    def _in(self, name: str, *argv: str) -> str:
        return ip("ip", "netns", "exec", name, *argv)

    def qdiscs(self, host: int) -> str:
        """`tc qdisc show` for host i's link, both ends."""
        return self._in(namespace(host), "tc", "qdisc", "show", "dev", "eth0") + self._in(
            SWITCH, "tc", "qdisc", "show", "dev", f"h{host}"
        )

    # ---- processes ------------------------------------------------------------------------------
    def env(self, host: int, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """This process's environment as seen from host i: Spark binds and advertises its
        address, and runs this interpreter for Python workers."""
        env = dict(os.environ)
        env.update(SPARK_LOCAL_IP=address(host), PYSPARK_PYTHON=sys.executable)
        env.update(extra or {})
        return env

    def popen(
        self,
        host: int | str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        log: Path | None = None,
        **kwargs: Any,
    ) -> subprocess.Popen[Any]:
        """Start a command inside host i's namespace (or the switch's, host="switch"), in a
        session of its own; it and its descendants are killed at teardown. With `log`, its
        stdout and stderr go there."""
        if self._closed:
            raise ClusterError("the cluster is not running")
        name = SWITCH if host == "switch" else namespace(int(host))
        if log is not None:
            handle = log.open("ab")
            self._logs.append(handle)
            kwargs.update(stdout=handle, stderr=subprocess.STDOUT)
        process = subprocess.Popen(
            ["ip", "netns", "exec", name, *argv],
            env=dict(env) if env is not None else self.env(0 if host == "switch" else int(host)),
            start_new_session=True,
            **kwargs,
        )
        self.processes.append(process)
        return process

    def run(
        self,
        host: int | str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        timeout: float = 600.0,
        input: str | None = None,
        **kwargs: Any,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command inside a host's namespace to its end (`input` on its stdin, its output
        captured as text); past `timeout` it is killed with its tree and
        subprocess.TimeoutExpired raised."""
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
        if input is not None:
            kwargs["stdin"] = subprocess.PIPE
        process = self.popen(host, argv, env, text=True, **kwargs)
        try:
            out, err = process.communicate(input, timeout=timeout)
        except BaseException:
            kill_tree([process.pid])
            process.communicate(timeout=KILL_TIMEOUT)
            raise
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)

    def pids(self, host: int) -> list[psutil.Process]:
        """The live processes inside host i."""
        found = []
        for pid in pids_in(namespace(host)):
            try:
                found.append(psutil.Process(pid))
            except psutil.Error:
                continue
        return found

    # ---- Spark standalone (standalone.py) -------------------------------------------------------
    @property
    def master_url(self) -> str:
        return f"spark://{address(0)}:{MASTER_PORT}"

    def alive_workers(self) -> int:
        """How many workers the master reports ALIVE (0 while it does not answer)."""
        return alive_workers()


def _raise_interrupt(number: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(number).name}")
