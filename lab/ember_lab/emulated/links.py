"""Link figures between emulated hosts (tcp_transfer.py): a bounded TCP bulk transfer for the
rate, and a bounded TCP ping-pong for the latency."""

from __future__ import annotations

import json
import random
import statistics
import sys
from pathlib import Path
from typing import Any

from ember_lab.emulated.netns import Cluster, address

SCRIPT = Path(__file__).parent / "tcp_transfer.py"  # run by path: stdlib only
PORT = 5201  # iperf's; nothing else listens on the emulated hosts' own addresses
TIMEOUT = 120.0
PINGS = 200  # round trips a latency is the median of: a few tens of milliseconds on a veth


def block(seed: int | None) -> bytes:
    """The 1 MiB block tcp_transfer.py repeats for a seed (the same code)."""
    return bytes(1 << 20) if seed is None else random.Random(seed).randbytes(1 << 20)


def transfer(
    cluster: Cluster, sender: int, receiver: int, size: int, seed: int | None = None
) -> dict[str, Any]:
    """Move `size` bytes over TCP from host `sender` to host `receiver` (zeros, or a random
    block from `seed` repeated); the sender's figures."""
    extra = [] if seed is None else [str(seed)]
    return _pair(cluster, sender, receiver, ("serve", "send"), size, extra, "transfer")


def round_trip(cluster: Cluster, sender: int, receiver: int, count: int = PINGS) -> dict[str, Any]:
    """`count` one-byte round trips over TCP from host `sender` to host `receiver` and back,
    each after the last: {"round_trips": count, "seconds": [each one's]}."""
    if not 1 <= count <= 100_000:
        raise ValueError(f"round trips: give a count from 1 to 100000, not {count}")
    return _pair(cluster, sender, receiver, ("echo", "ping"), count, [], "ping")


def one_way_latency(seconds: list[float]) -> float:
    """A link's one-way latency from round trips' seconds: half the median. The median, since
    a round trip the scheduler delayed on a busy host says nothing of the link; half, since a
    round trip crosses it twice and the model charges the latency once each way."""
    if not seconds or min(seconds) < 0:
        raise ValueError("a latency needs at least one round trip, none negative")
    return statistics.median(seconds) / 2


def _pair(
    cluster: Cluster,
    client: int,
    server_host: int,
    roles: tuple[str, str],
    amount: int,
    extra: list[str],
    what: str,
) -> dict[str, Any]:
    """Run tcp_transfer.py's server role in one host and its client role in the other, both
    bounded by TIMEOUT; the client's JSON line."""
    command = [sys.executable, str(SCRIPT)]
    where = [address(server_host), str(PORT), str(amount)]
    server = cluster.popen(
        server_host,
        [*command, roles[0], *where],
        stdout=-1,  # subprocess.PIPE: its "listening" line says when to connect
        text=True,
    )
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "listening":
            raise RuntimeError(f"the {what} server on host {server_host} did not start")
        done = cluster.run(client, [*command, roles[1], *where, *extra], timeout=TIMEOUT)
        if done.returncode != 0:
            raise RuntimeError(f"the {what} from host {client} failed: {done.stderr[-2000:]}")
        server.wait(TIMEOUT)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)
        if server.stdout is not None:
            server.stdout.close()
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result
