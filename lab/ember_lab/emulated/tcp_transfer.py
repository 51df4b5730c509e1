"""A bounded TCP bulk transfer between two hosts, like iperf: `serve` takes one connection and
reads BYTES; `send` writes BYTES (a 1 MiB block repeated: zeros, or random from SEED) and prints
one JSON line with the seconds until the server acknowledged the last byte, and the rate.
And a ping-pong, like a TCP ping: `echo` takes one connection and returns COUNT bytes one at a
time; `ping` sends them one at a time, each after the last came back, and prints one JSON line
with the seconds of every round trip.

Usage: python tcp_transfer.py serve ADDRESS PORT BYTES
       python tcp_transfer.py send ADDRESS PORT BYTES [SEED]
       python tcp_transfer.py echo ADDRESS PORT COUNT
       python tcp_transfer.py ping ADDRESS PORT COUNT"""

import json
import random
import socket
import sys
import time

TIMEOUT = 60.0  # seconds any one socket call may block
CHUNK = 1 << 20


def serve(address: str, port: int, size: int) -> None:
    listener = socket.create_server((address, port))
    listener.settimeout(TIMEOUT)
    print("listening", flush=True)
    peer, _ = listener.accept()
    peer.settimeout(TIMEOUT)
    buffer = bytearray(CHUNK)
    left = size
    while left:
        got = peer.recv_into(buffer, min(left, CHUNK))
        if not got:
            raise SystemExit(f"the sender closed with {left} bytes still to come")
        left -= got
    peer.sendall(b"k")
    peer.close()
    listener.close()


def block(seed: int | None) -> bytes:
    return bytes(CHUNK) if seed is None else random.Random(seed).randbytes(CHUNK)


def send(address: str, port: int, size: int, seed: int | None = None) -> None:
    peer = socket.create_connection((address, port), timeout=TIMEOUT)
    payload = memoryview(block(seed))
    started = time.perf_counter()
    left = size
    while left:
        step = min(left, CHUNK)
        peer.sendall(payload[:step])
        left -= step
    if peer.recv(1) != b"k":
        raise SystemExit("the server did not acknowledge the transfer")
    seconds = time.perf_counter() - started
    peer.close()
    print(json.dumps({"bytes": size, "seconds": seconds, "gbit_per_s": size * 8 / seconds / 1e9}))


def echo(address: str, port: int, count: int) -> None:
    listener = socket.create_server((address, port))
    listener.settimeout(TIMEOUT)
    print("listening", flush=True)
    peer, _ = listener.accept()
    peer.settimeout(TIMEOUT)
    peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no waiting to fill a segment
    for _ in range(count):
        got = peer.recv(1)
        if not got:
            raise SystemExit("the pinger closed before its last round trip")
        peer.sendall(got)
    peer.close()
    listener.close()


def ping(address: str, port: int, count: int) -> None:
    peer = socket.create_connection((address, port), timeout=TIMEOUT)
    peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    seconds = []
    for _ in range(count):
        started = time.perf_counter()
        peer.sendall(b"p")
        if peer.recv(1) != b"p":
            raise SystemExit("the echo server did not answer the round trip")
        seconds.append(time.perf_counter() - started)
    peer.close()
    print(json.dumps({"round_trips": count, "seconds": seconds}))


if __name__ == "__main__":
    role, address, port, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if role == "serve":
        serve(address, port, size)
    elif role == "echo":
        echo(address, port, size)
    elif role == "ping":
        ping(address, port, size)
    else:
        send(address, port, size, int(sys.argv[5]) if len(sys.argv) > 5 else None)
