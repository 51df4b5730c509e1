"""One worker's parameter exchanges over an emulated link, alone: what the link costs an
exchange beyond its rate (CURVE at both ends, the TCP stack, the shaper's pacing) in wall time
and in CPU. measure_exchange runs it inside the hosts, as
`python -m ember_lab.bench.exchange_probe`:

    serve ADDRESS FLOATS         a parameter server of FLOATS float32 on ADDRESS, port PORT
    probe SERVER FLOATS COUNT    push and pull all FLOATS, COUNT times after WARM_UP

Both read the run's secret, in hex, as the first line of their stdin (never on the command
line). `serve` says "listening" and serves until told to stop; `probe` says "warm" after its
warm-up, then one JSON line: the median wall seconds of an exchange and its own CPU seconds
per exchange (its zmq thread's included).

The launcher adds the server's CPU and the machine's CPU that no process was charged for
(`kernel_cpu`): on emulated hosts the kernel carries every byte through two veths, the
bridge and the shapers, and a shaper's timer sends what it held back in a softirq on
whatever core it fires, often an idle one. At 1 Gbit/s that was a third of an exchange's
CPU."""

from __future__ import annotations

import json
import os
import select
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np
import psutil

from ember.probe import wait_ready

PORT = 5202  # beside emulated.links.PORT; nothing else listens on the emulated hosts' own addresses
WARM_UP = 3  # exchanges before the timed ones: connecting, the buffers' first touches
PROBE_SECONDS = 60.0  # the timed exchanges stop by then, however many are left
FLOATS = 1 << 18  # 1 MiB each way: about MNIST mlp's 269,322 parameters
EXCHANGES = 40
TIMEOUT = 120.0  # for either process to say what it says


def measure_exchange(cluster: Any, client_host: int, server_host: int) -> dict[str, Any]:
    """Time EXCHANGES push + pulls of FLOATS from `client_host` to a server on `server_host`
    of an emulated cluster: {"bytes": moved per exchange, "seconds": the median wall time,
    "client_cpu", "server_cpu": CPU seconds per exchange}. Both processes are bounded and
    killed at the end, whatever happens."""
    from ember_lab.emulated.netns import address

    secret = os.urandom(32).hex() + "\n"
    command = [sys.executable, "-m", "ember_lab.bench.exchange_probe"]
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
    server = cluster.popen(server_host, [*command, "serve", address(server_host), str(FLOATS)],
                           **pipes)  # fmt: skip
    client = None
    try:
        _tell(server, secret)
        _expect(server, "listening", f"the exchange server on host {server_host}")
        client = cluster.popen(client_host, [*command, "probe", address(server_host),
                                             str(FLOATS), str(EXCHANGES)], **pipes)  # fmt: skip
        _tell(client, secret)
        _expect(client, "warm", f"the exchange probe on host {client_host}")
        serving = psutil.Process(server.pid)
        before, machine = sum(serving.cpu_times()[:2]), cpu_snapshot()
        figures = json.loads(_expect(client, "{", f"the exchange probe on host {client_host}"))
        count = figures["exchanges"]
        figures["server_cpu"] = (sum(serving.cpu_times()[:2]) - before) / count
        figures["kernel_cpu"] = unattributed_cpu(machine, cpu_snapshot()) / count
        server.wait(TIMEOUT)
    finally:
        for process in (p for p in (client, server) if p is not None):
            if process.poll() is None:
                process.kill()
            process.wait(10)
            for stream in (process.stdin, process.stdout):
                if stream is not None:
                    stream.close()
    return {"bytes": 2 * 4 * FLOATS, **figures}


CpuSnapshot = tuple[float, dict[tuple[int, float], float]]


def cpu_snapshot() -> CpuSnapshot:
    """Seconds the cores of this machine have spent busy so far (in processes, the kernel,
    interrupts and softirqs), and each user process's own CPU seconds, by (pid, start time).
    The kernel's own threads (kthreadd's children, ksoftirqd among them) count as uncharged."""
    idle = ("idle", "iowait", "guest", "guest_nice")  # guest time is already in user time
    busy = sum(value for name, value in psutil.cpu_times()._asdict().items() if name not in idle)
    charged: dict[tuple[int, float], float] = {}
    for process in psutil.process_iter(["ppid", "cpu_times", "create_time"]):
        if process.pid == 2 or process.info["ppid"] == 2:  # kthreadd's: the kernel's own
            continue
        times = process.info["cpu_times"]
        if times is not None:  # None: gone, or not ours to read
            charged[process.pid, process.info["create_time"]] = times.user + times.system
    return busy, charged


def unattributed_cpu(before: CpuSnapshot, after: CpuSnapshot) -> float:
    """CPU seconds between two snapshots that no process was charged for: the kernel's work
    for the exchanges. Each process counts what it used in between, so one that exits
    meanwhile (a Spark JVM of the row before) takes only its last moments with it, not the
    seconds it had used before, which the machine's total already held."""
    busy = after[0] - before[0]
    charged = sum(seconds - before[1].get(key, 0.0) for key, seconds in after[1].items())
    return max(0.0, busy - charged)


def _tell(process: subprocess.Popen[str], line: str) -> None:
    assert process.stdin is not None
    process.stdin.write(line)
    process.stdin.close()


def _expect(process: subprocess.Popen[str], start: str, what: str) -> str:
    """The process's next line, which starts with `start`, within TIMEOUT seconds."""
    assert process.stdout is not None
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if wait_ready(process.stdout.fileno(), select.POLLIN, deadline - time.monotonic()):
            line = process.stdout.readline()
            if line.startswith(start):
                return line.strip()
            if not line:
                break
    raise RuntimeError(f"{what} did not say {start!r} within {TIMEOUT:g} s")


def serve(address: str, floats: int, secret: bytes) -> None:
    from ember.probe import ParameterServer, SGDRule, ShardSpec, make_consistency

    server = ParameterServer(
        ShardSpec(0, 1, 0, floats),
        np.zeros(floats, dtype=np.float32),
        SGDRule(lr=0.0),
        make_consistency("async", 0),
        secret,
        bind=f"tcp://{address}:{PORT}",
        expected_workers=1,
    )
    print("listening", flush=True)
    server.serve()


def probe(server: str, floats: int, count: int, secret: bytes) -> None:
    from ember.probe import PSClient, control

    address = f"tcp://{server}:{PORT}"
    client = PSClient([address], secret, worker=0, timeout=30.0)
    try:
        client.register()
        gradient, reply = np.zeros(floats, dtype=np.float32), np.empty(floats, dtype=np.float32)
        for _ in range(WARM_UP):
            client.push(gradient, reply_into=reply, pull=True)
        print("warm", flush=True)
        walls: list[float] = []
        deadline = time.monotonic() + PROBE_SECONDS
        cpu = time.process_time()
        while len(walls) < count and time.monotonic() < deadline:
            started = time.perf_counter()
            client.push(gradient, reply_into=reply, pull=True)
            walls.append(time.perf_counter() - started)
        cpu = time.process_time() - cpu
        client.done()
    finally:
        client.close()
    control([address], secret, "stop", timeout=10.0)
    figures = {"exchanges": len(walls), "seconds": statistics.median(walls)}
    print(json.dumps({**figures, "client_cpu": cpu / len(walls)}), flush=True)


def main(argv: list[str]) -> None:
    secret = bytes.fromhex(sys.stdin.readline().strip())
    if argv[0] == "serve":
        serve(argv[1], int(argv[2]), secret)
    else:
        probe(argv[1], int(argv[2]), int(argv[3]), secret)


if __name__ == "__main__":
    main(sys.argv[1:])
