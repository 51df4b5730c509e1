"""What peers can make a parameter server hold: the hardening figures, on 127.0.0.1.

    python benchmarks/hardening.py [--quick] [--out FILE]

1. Server RSS growth while a raw ZMTP peer without the keys sends 1 GiB of one message it never
   finishes, with CURVE (the default) and with --encrypt off.
2. Legitimate handshakes (of 5) that get through while 2,000 identities flood the server with
   HELLOs under keys it does not know.
3. The clock table after 10,000 join-and-leave cycles.
4. A server process's open fds after 1,000 connect-and-close cycles, each with a region.
5. Server RSS growth while a credentialed client sends 60 pulls and reads no reply, beside a
   worker that trains; and how many of its requests were refused.
--quick is a smoke test for CI: 64 MiB, 200 identities, 500 cycles, 100 connections, 20 pulls;
--only NAME (repeatable) runs just those measurements.
Every loop is bounded in count and time; processes started here are stopped here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for tests.peers

from ember.algorithms.rules import SGDRule
from ember.config import RunConfig
from ember.engines.servers import ServerGroup
from ember.ps import control
from ember.wire import ClientConnection, curve, shared
from tests.conftest import SECRET, running_servers
from tests.peers import (
    attack,
    endpoint_process,
    hello_flood,
    join_and_leave,
    open_fds,
    unread_pulls,
)

MiB = 1 << 20
FULL = {"attack": 1024 * MiB, "flood": 2000, "cycles": 10_000, "connections": 1000, "pulls": 60}
QUICK = {"attack": 64 * MiB, "flood": 200, "cycles": 500, "connections": 100, "pulls": 20}
SLOW_READER_KEYS = 1 << 20  # a 4 MiB shard
LOOP_SECONDS = 300.0  # the most any one measurement's loop runs


def unfinished_message(total: int) -> dict[str, Any]:
    out = {}
    for encrypt in (True, False):
        growth, sent, dropped = attack(encrypt, SECRET, total)
        out["curve" if encrypt else "plain"] = {
            "sent_mib": sent // MiB,
            "rss_growth_mib": round(growth / MiB, 1),
            "dropped": dropped,
        }
    return out


def flood(peers: int) -> dict[str, Any]:
    keys = curve.run_keys(SECRET)
    context = zmq.Context.instance()
    zap = curve.handler(context)
    with running_servers(np.zeros(16, dtype=np.float32), SGDRule(lr=1.0)) as (server,):
        denied_before = zap.denied[keys.domain]
        flooding = threading.Event()
        results: list[float | str] = []

        def workers() -> None:
            flooding.wait(30)
            for _ in range(5):
                started = time.perf_counter()
                try:
                    ClientConnection(server.address, SECRET, timeout=10).close()
                    results.append(time.perf_counter() - started)
                except Exception as exc:
                    results.append(repr(exc))

        legitimate = threading.Thread(target=workers)
        legitimate.start()
        try:
            wave = min(100, peers)
            denied = lambda: zap.denied[keys.domain]  # noqa: E731
            hello_flood(
                context, server.address, keys.server_public, peers, wave, denied, flooding.set
            )
        finally:
            legitimate.join(60)
        seconds = [r for r in results if isinstance(r, float)]
        return {
            "identities": peers,
            "refused_at_handshake": zap.denied[keys.domain] - denied_before,
            "legitimate_ok": len(seconds),
            "legitimate_of": 5,
            "slowest_handshake_s": round(max(seconds), 3) if seconds else None,
        }


def join_cycles(cycles: int) -> dict[str, Any]:
    params = np.zeros(8, dtype=np.float32)
    with running_servers(params, SGDRule(lr=1.0), expected_workers=2) as (server,):
        connection = ClientConnection(server.address, SECRET, timeout=10)
        before = control([server.address], SECRET, "stats")[0]["workers"]["table"]
        deadline, done = time.monotonic() + LOOP_SECONDS, 0
        for cycle in range(cycles):
            join_and_leave(connection, (1 << 31) + cycle)
            done += 1
            if time.monotonic() > deadline:
                break
        connection.close()
        after = control([server.address], SECRET, "stats")[0]["workers"]
    return {"cycles": done, "table_before": before, "table_after": after["table"]}


def connect_cycles(connections: int) -> dict[str, Any]:
    with endpoint_process(True, SECRET) as (pid, address):
        warm = ClientConnection(address, SECRET, timeout=10)
        warm.share_memory(1 << 16)  # every lazy fd of the process is open after this
        warm.close()
        time.sleep(0.5)
        before = open_fds(pid)
        deadline, done, attached = time.monotonic() + LOOP_SECONDS, 0, 0
        for _ in range(connections):
            connection = ClientConnection(address, SECRET, timeout=10)
            attached += connection.share_memory(1 << 16)
            connection.close()
            done += 1
            if time.monotonic() > deadline:
                break
        settle = time.monotonic() + 20
        while open_fds(pid) > before + 8 and time.monotonic() < settle:
            time.sleep(0.2)
        after = open_fds(pid)
    return {"connections": done, "with_region": attached, "fds_before": before, "fds_after": after}


def slow_reader(pulls: int) -> dict[str, Any]:
    os.environ[shared.DISABLE_VARIABLE] = "0"  # replies over the socket, where they queue
    config = RunConfig(strategy="async", workers=2).validate()
    initial = np.zeros(SLOW_READER_KEYS, dtype=np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        group = ServerGroup(config, initial, SECRET, Path(tmp))
        try:
            (address,) = group.start()
            pid = group.processes[0].pid
            growth, honest, slow = unread_pulls(address, pid, SECRET, SLOW_READER_KEYS, pulls)
            stats = control([address], SECRET, "stats")[0]
            honest.close()
            slow.close()
        finally:
            group.stop()
    return {
        "shard_mib": 4 * SLOW_READER_KEYS // MiB,
        "unread_pulls": pulls,
        "rss_growth_mib": round(growth / MiB, 1),
        "refused": stats["rejected"].get("slow_reader", 0),
        "copies_for_slow_readers": stats["counters"].get("copies_for_slow_readers", 0),
    }


MEASURES: dict[str, tuple[Any, str]] = {  # name -> (measurement, its size in FULL and QUICK)
    "unfinished_message": (unfinished_message, "attack"),
    "hello_flood": (flood, "flood"),
    "join_and_leave": (join_cycles, "cycles"),
    "connect_and_close": (connect_cycles, "connections"),
    "slow_reader": (slow_reader, "pulls"),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke test: small sizes")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures here")
    parser.add_argument(
        "--only", choices=list(MEASURES), action="append", help="just these measurements"
    )
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    figures = {}
    for name in args.only or MEASURES:
        measure, size = MEASURES[name]
        figures[name] = measure(sizes[size])
        print(f"{name}: {json.dumps(figures[name])}", flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
