"""What peers can make a parameter server hold: the hardening figures, on 127.0.0.1.

    python lab/benchmarks/hardening.py [--quick] [--out FILE]

1. Server RSS growth while a raw ZMTP peer sends 1 GiB of one message it never finishes:
   without the keys, with CURVE (the default) and with --encrypt off; and holding the run's
   secret (a malicious worker), with CURVE (a raw CURVE client) and without.
2. Server RSS growth while 1,000 raw peers without the keys each greet as CURVE clients, send
   all but the last byte of a 1 MiB handshake command, and keep their connections open.
3. Legitimate handshakes (of 5, each given 10 s) that get through while 2,000 identities flood
   the server with HELLOs under keys it does not know, and while 2,000 sockets holding the
   run's keys flood it with ember HELLOs nonstop (server RSS growth beside it).
4. Legitimate handshakes (of 5, each given 10 s) to a server limited to 1,024 open files
   while 1,088 raw peers hold connections that only greet.
5. The clock table after 10,000 join-and-leave cycles.
6. Sessions a server still holds after 10,000 connections closed right after their handshake
   (half of them with ember's client, half keyed peers that say nothing afterwards).
7. A server process's open fds after 1,000 connect-and-close cycles, each with a region.
8. Server RSS growth while a credentialed client sends 60 pulls and reads no reply, beside a
   worker that trains; and how many of its requests were refused.
--quick is a smoke test for CI: 64 MiB messages, 100 holders, 200 identities, 500 cycles, 100
connections, 20 pulls; --only NAME (repeatable) runs just those measurements.
Every loop is bounded in count and time; processes started here are stopped here.
"""

from __future__ import annotations

import argparse
import contextlib
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: tests.rogue_peers

from ember.config import RunConfig
from ember.probe import (
    CLOSING_SECONDS,
    ClientConnection,
    ServerGroup,
    SGDRule,
    control,
    curve,
    shared,
)
from tests.conftest import SECRET, running_servers
from tests.rogue_peers import (
    attack,
    endpoint_process,
    hello_flood,
    hold_handshakes,
    idle_greeter,
    join_and_leave,
    keyed_socket,
    open_fds,
    open_session_by_hand,
    rss,
    unread_pulls,
)

MiB = 1 << 20
FULL = {
    "attack": 1024 * MiB,
    "holders": 1000,
    "flood": 2000,
    "greeters": 1088,
    "cycles": 10_000,
    "connections": 1000,
    "pulls": 60,
}
QUICK = {
    "attack": 64 * MiB,
    "holders": 100,
    "flood": 200,
    "greeters": 1088,
    "cycles": 500,
    "connections": 100,
    "pulls": 20,
}
SLOW_READER_KEYS = 1 << 20  # a 4 MiB shard
LOOP_SECONDS = 300.0  # the most any one measurement's loop runs
UNFINISHED = [  # (name, CURVE, sent by a peer holding the run's secret)
    ("curve", True, False),
    ("plain", False, False),
    ("keyed_curve", True, True),
    ("keyed_plain", False, True),
]


def unfinished_message(total: int) -> dict[str, Any]:
    out = {}
    for name, encrypt, keyed in UNFINISHED:
        growth, sent, was_dropped = attack(encrypt, SECRET, total, keyed)
        out[name] = {
            "sent_mib": sent // MiB,
            "rss_growth_mib": round(growth / MiB, 1),
            "dropped": was_dropped,
        }
    return out


def holders(count: int) -> dict[str, Any]:
    with endpoint_process(True, SECRET) as (pid, address):
        growth, held, gone = hold_handshakes(pid, address, count)
    return {
        "holders": held,
        "sent_mib": held,
        "rss_growth_mib": round(growth / MiB, 1),
        "dropped": gone,
    }


def legitimate_handshakes(address: str, results: list[float | str], wait: float = 10) -> None:
    for _ in range(5):
        started = time.perf_counter()
        try:
            ClientConnection(address, SECRET, timeout=wait).close()
            results.append(time.perf_counter() - started)
        except Exception as exc:
            results.append(repr(exc))


def _handshakes(results: list[float | str]) -> dict[str, Any]:
    seconds = [r for r in results if isinstance(r, float)]
    return {
        "legitimate_ok": len(seconds),
        "legitimate_of": len(results),
        "slowest_handshake_s": round(max(seconds), 3) if seconds else None,
    }


def keyed_flood(peers: int) -> dict[str, Any]:
    context = zmq.Context()
    context.set(zmq.MAX_SOCKETS, peers + 64)
    flood: list[zmq.Socket] = []
    results: list[float | str] = []
    with endpoint_process(True, SECRET) as (pid, address):
        time.sleep(0.5)
        before = peak = rss(pid)
        try:
            for _ in range(peers):
                sock = keyed_socket(context, SECRET)
                sock.connect(address)
                flood.append(sock)
            legitimate = threading.Thread(target=legitimate_handshakes, args=(address, results))
            legitimate.start()
            deadline = time.monotonic() + 30
            while legitimate.is_alive() and time.monotonic() < deadline:
                for sock in flood:  # nonstop: each says HELLO again whenever zmq takes it
                    with contextlib.suppress(zmq.Again):
                        sock.send(b"EMBER2-HELLO" + os.urandom(32), zmq.NOBLOCK)
                peak = max(peak, rss(pid))
            legitimate.join(60)
            peak = max(peak, rss(pid))
        finally:
            for sock in flood:
                sock.close(linger=0)
            context.term()
    return {
        "keyed_sockets": peers,
        **_handshakes(results),
        "rss_growth_mib": round((peak - before) / MiB, 1),
    }


def descriptor_limit(greeters: int) -> dict[str, Any]:
    held = []
    results: list[float | str] = []
    with endpoint_process(True, SECRET, open_files=1024) as (_pid, address):
        try:
            for _ in range(greeters):
                held.append(idle_greeter(address))
            time.sleep(1)
            legitimate_handshakes(address, results)
        finally:
            for peer in held:
                peer.close()
    return {"open_files": 1024, "greeters": len(held), **_handshakes(results)}


def session_cycles(cycles: int) -> dict[str, Any]:
    context = zmq.Context.instance()
    with running_servers(np.zeros(8, dtype=np.float32), SGDRule(lr=1.0)) as (server,):
        endpoint = server.endpoint
        before = endpoint.peer_state["sessions"]
        deadline, done = time.monotonic() + LOOP_SECONDS, 0
        for cycle in range(cycles):
            if cycle % 2:
                ClientConnection(server.address, SECRET, timeout=10).close()
            else:  # a keyed peer: a session, and nothing more
                sock = keyed_socket(context, SECRET)
                with contextlib.closing(sock):
                    sock.connect(server.address)
                    open_session_by_hand(sock, SECRET)
            done += 1
            if time.monotonic() > deadline:
                break
        settle = time.monotonic() + CLOSING_SECONDS + 20
        while endpoint.peer_state["sessions"] > before and time.monotonic() < settle:
            time.sleep(0.2)
        after = endpoint.peer_state
    return {
        "cycles": done,
        "sessions_before": before,
        "sessions_after": after["sessions"],
        "connections_after": after["accepted"],
    }


def flood(peers: int) -> dict[str, Any]:
    """Identities under keys the server does not know: ZAP refuses them."""
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
    "handshake_holders": (holders, "holders"),
    "hello_flood": (flood, "flood"),
    "keyed_hello_flood": (keyed_flood, "flood"),
    "descriptor_limit": (descriptor_limit, "greeters"),
    "join_and_leave": (join_cycles, "cycles"),
    "session_cycles": (session_cycles, "cycles"),
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
