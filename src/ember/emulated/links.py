"""Link figures between emulated hosts: a bounded TCP bulk transfer (tcp_transfer.py)."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

from ember.emulated.netns import Cluster, address

SCRIPT = Path(__file__).parent / "tcp_transfer.py"  # run by path: stdlib only
PORT = 5201  # iperf's; nothing else listens on the emulated hosts' own addresses
TIMEOUT = 120.0


def block(seed: int | None) -> bytes:
    """The 1 MiB block tcp_transfer.py repeats for a seed (the same code)."""
    return bytes(1 << 20) if seed is None else random.Random(seed).randbytes(1 << 20)


def transfer(
    cluster: Cluster, sender: int, receiver: int, size: int, seed: int | None = None
) -> dict[str, Any]:
    """Move `size` bytes over TCP from host `sender` to host `receiver` (zeros, or a random
    block from `seed` repeated); the sender's figures."""
    command = [sys.executable, str(SCRIPT)]
    server = cluster.popen(
        receiver,
        [*command, "serve", address(receiver), str(PORT), str(size)],
        stdout=-1,  # subprocess.PIPE: its "listening" line says when to connect
        text=True,
    )
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "listening":
            raise RuntimeError(f"the transfer server on host {receiver} did not start")
        done = cluster.run(
            sender,
            [*command, "send", address(receiver), str(PORT), str(size)]
            + ([] if seed is None else [str(seed)]),
            timeout=TIMEOUT,
        )
        if done.returncode != 0:
            raise RuntimeError(f"the transfer from host {sender} failed: {done.stderr[-2000:]}")
        server.wait(TIMEOUT)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)
        if server.stdout is not None:
            server.stdout.close()
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result
