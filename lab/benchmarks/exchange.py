"""exchange: push+pull throughput of ember's parameter server against raw pyzmq and gloo.

Each system moves the same bytes per round trip: N float32 to a peer process and N float32 back.
- ember: a real ParameterServer (1 shard, SGD lr 0.01 without momentum, async consistency,
  HMAC-authenticated) in a child process; a PSClient here does `push(grad, reply_into=params,
  pull=True)`, so every round trip also authenticates headers and applies an SGD update. On one
  host the payloads go through shared memory, as they do in training.
  Encrypted (CURVE) as a run is by default; with shared memory CURVE wraps only the headers.
- ember socket: the same with EMBER_SHARED_MEMORY=0 and `--encrypt off`, every payload over the
  plain TCP socket, as between hosts on a trusted network.
- ember socket curve: the socket path encrypted with CURVE, as between hosts by default.
- ember socket aead: the socket path with the "aead" wire cipher: HMAC-sealed headers and
  AES-256-GCM (or ChaCha20-Poly1305) payload frames that ember seals, no CURVE.
- raw pyzmq: a ROUTER child echoes a same-size reply; DEALER client; ember's frame size,
  copy=False both ways, received into preallocated arrays; no auth, no header, no update.
- gloo: two child processes, rank 0 sends N floats then receives N, rank 1 the reverse.

Usage: python lab/benchmarks/exchange.py [--sizes 0.27M 10M] [--repeat R] [--quick] [--out F.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import numpy as np
import zmq

from common import (
    SPAWN,
    check,
    finish,
    fmt,
    make_parser,
    markdown_table,
    report,
    set_threads,
    spread,
    start,
)
from ember.probe import CHUNK_BYTES, free_port

SIZES = ("0.27M", "1M", "10M", "25M")
QUICK_SIZES = ("0.27M",)  # the reference mlp's size
WARMUP = 2  # untimed round trips before each timed batch
TIMEOUT_MS = 120_000  # a peer that does not answer within this is an error, not a hang
TARGET = 0.8  # ember / max(raw, gloo) should reach this at every size
SOCKET_TARGET = 1.0  # ember socket / gloo: ember's TCP path against the best TCP peer
SYSTEMS = ("ember", "ember socket", "ember socket curve", "ember socket aead", "raw pyzmq", "gloo")
BASELINES = ("raw pyzmq", "gloo")


def parse_size(text: str) -> int:
    """'0.27M' -> 270000 floats; also K and plain integers."""
    scale = {"K": 1_000, "M": 1_000_000}.get(text[-1:].upper(), 1)
    try:
        size = round(float(text[:-1] if scale > 1 else text) * scale)
    except ValueError:
        size = 0
    if size < 1:
        raise argparse.ArgumentTypeError(
            f"size must be a count like 270000, 0.27M or 500K; got {text!r}"
        )
    return size


def size_label(text: str) -> str:
    """An argparse type: keep the user's spelling for the table once it parses."""
    parse_size(text)
    return text


def iterations_for(size: int, quick: bool) -> int:
    """Timed round trips per repeat: more for small sizes, whose round trips take a millisecond
    or two and are easily disturbed; fewer for the largest."""
    if quick:
        return 5
    if size <= 1_000_000:
        return 50
    return 10 if size <= 10_000_000 else 5


def time_round_trips(round_trip: Callable[[], None], iterations: int) -> list[float]:
    """Seconds per round trip, after WARMUP untimed ones."""
    for _ in range(WARMUP):
        round_trip()
    times = []
    for _ in range(iterations):
        started = time.perf_counter()
        round_trip()
        times.append(time.perf_counter() - started)
    return times


def _receive_address(receiver: Any, what: str) -> Any:
    if not receiver.poll(TIMEOUT_MS / 1000):
        raise RuntimeError(f"{what} did not report its address within {TIMEOUT_MS / 1000:g}s")
    return receiver.recv()


# ---- ember --------------------------------------------------------------------------------------
def _use_wire(wire: str) -> None:
    """This process's transport: "off", or encrypted by "curve" or "aead"."""
    from ember.probe import curve, use_encryption

    use_encryption(wire != "off")
    curve.use_wire_cipher("curve" if wire == "off" else wire)


def _ember_server(size: int, secret: bytes, wire: str, address_pipe: Any) -> None:
    set_threads()
    from ember.probe import ParameterServer, SGDRule, ShardSpec, make_consistency

    _use_wire(wire)

    # The client idles while the other systems are timed: keep it in the clock table meanwhile.
    server = ParameterServer(
        ShardSpec(0, 1, 0, size),
        np.zeros(size, dtype=np.float32),
        SGDRule(lr=0.01, momentum=0.0),
        make_consistency("async"),
        secret,
        worker_timeout=3600.0,
    )
    address_pipe.send(server.address)
    server.serve()


class EmberPeer:
    """A ParameterServer child and a registered PSClient pushing gradients and pulling params."""

    def __init__(self, size: int, shared_memory: bool = True, wire: str = "curve") -> None:
        from ember.probe import PSClient, shared

        self.secret = os.urandom(32)
        receiver, sender = SPAWN.Pipe(duplex=False)
        self.process = start(_ember_server, size, self.secret, wire, sender)
        self.address = _receive_address(receiver, "the ember parameter server")
        self.wire = wire
        _use_wire(wire)  # the client's connections take the process's setting
        self.client = PSClient([self.address], self.secret, worker=0, timeout=TIMEOUT_MS / 1000)
        chosen = os.environ.get(shared.DISABLE_VARIABLE)
        os.environ[shared.DISABLE_VARIABLE] = "1" if shared_memory else "0"
        try:  # the client offers a region (or not) when it registers
            self.client.register()
        finally:
            os.environ.pop(shared.DISABLE_VARIABLE)
            if chosen is not None:
                os.environ[shared.DISABLE_VARIABLE] = chosen
        if self.client.connections[0].shared != shared_memory:
            raise RuntimeError(f"ember's shared memory is {'off' if shared_memory else 'on'}")
        self.grad = np.random.default_rng(0).standard_normal(size, dtype=np.float32)
        self.params = np.empty(size, dtype=np.float32)

    def measure(self, iterations: int) -> list[float]:
        return time_round_trips(self._round_trip, iterations)

    def _round_trip(self) -> None:
        self.client.push(self.grad, reply_into=self.params, pull=True)

    def close(self) -> None:
        from ember.probe import control

        self.client.close()
        _use_wire(self.wire)  # the stop request's connection speaks its server's transport
        control([self.address], self.secret, "stop")
        finish([self.process])


# ---- raw pyzmq ----------------------------------------------------------------------------------
def chunks(array: np.ndarray) -> Iterator[memoryview]:
    """The array's bytes as views of at most CHUNK_BYTES (nothing copied)."""
    flat = memoryview(array.view(np.uint8))
    for offset in range(0, flat.nbytes, CHUNK_BYTES):
        yield flat[offset : offset + CHUNK_BYTES]


def receive_into(frames: list[zmq.Frame], out: np.ndarray) -> None:
    """Copy frames in order into `out`: the one copy into the receiver's own storage."""
    offset = 0
    for frame in frames:
        part = np.frombuffer(frame.buffer, dtype=out.dtype)
        out[offset : offset + part.size] = part
        offset += part.size
    if offset != out.size:
        raise RuntimeError(f"received {offset} floats, expected {out.size}")


def _socket(context: zmq.Context, kind: int) -> zmq.Socket:
    sock = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
    sock.setsockopt(zmq.SNDTIMEO, TIMEOUT_MS)
    return sock


def _raw_echo_server(size: int, address_pipe: Any) -> None:
    set_threads()
    sock = _socket(zmq.Context.instance(), zmq.ROUTER)
    sock.setsockopt(zmq.RCVTIMEO, -1)  # idles while the other systems are timed
    sock.bind("tcp://127.0.0.1:0")
    address_pipe.send(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    inbox = np.empty(size, dtype=np.float32)
    outbox = np.zeros(size, dtype=np.float32)
    while True:
        peer, *payload = sock.recv_multipart(copy=False)
        if len(payload) == 1 and payload[0].bytes == b"stop":
            break
        receive_into(payload, inbox)
        sock.send_multipart([peer, *chunks(outbox)], copy=False)
    sock.close()


class RawZmqPeer:
    """A DEALER talking to a ROUTER child that echoes a same-size reply."""

    def __init__(self, size: int) -> None:
        receiver, sender = SPAWN.Pipe(duplex=False)
        self.process = start(_raw_echo_server, size, sender)
        self.sock = _socket(zmq.Context.instance(), zmq.DEALER)
        self.sock.connect(_receive_address(receiver, "the raw pyzmq echo server"))
        self.grad = np.random.default_rng(0).standard_normal(size, dtype=np.float32)
        self.params = np.empty(size, dtype=np.float32)

    def measure(self, iterations: int) -> list[float]:
        return time_round_trips(self._round_trip, iterations)

    def _round_trip(self) -> None:
        self.sock.send_multipart(list(chunks(self.grad)), copy=False)
        receive_into(self.sock.recv_multipart(copy=False), self.params)

    def close(self) -> None:
        self.sock.send(b"stop")
        finish([self.process])
        self.sock.close()


# ---- torch.distributed gloo ---------------------------------------------------------------------
def _gloo_rank(rank: int, size: int, port: int, commands: Any) -> None:
    """Serve `iterations` commands (None ends) with timed send/recv pairs; reply with times."""
    set_threads()
    import torch
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=timedelta(milliseconds=TIMEOUT_MS),
    )
    outgoing = torch.randn(size)
    incoming = torch.empty(size)

    def round_trip() -> None:
        if rank == 0:
            dist.send(outgoing, dst=1)
            dist.recv(incoming, src=1)
        else:
            dist.recv(incoming, src=0)
            dist.send(outgoing, dst=0)

    while (iterations := commands.recv()) is not None:
        commands.send(time_round_trips(round_trip, iterations))
    dist.destroy_process_group()


class GlooPeer:
    """Two gloo ranks in child processes; rank 0's view of each round trip is reported."""

    def __init__(self, size: int) -> None:
        port = free_port()
        self.pipes, self.processes = [], []
        for rank in range(2):
            parent, child = SPAWN.Pipe()
            self.pipes.append(parent)
            self.processes.append(start(_gloo_rank, rank, size, port, child))

    def measure(self, iterations: int) -> list[float]:
        for pipe in self.pipes:
            pipe.send(iterations)
        times = []
        for rank, pipe in enumerate(self.pipes):
            if not pipe.poll(TIMEOUT_MS / 1000):
                raise RuntimeError(f"gloo rank {rank} did not finish its round trips")
            times.append(pipe.recv())
        return times[0]

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.send(None)
        finish(self.processes)


PEERS: dict[str, Callable[[int], Any]] = {
    "ember": EmberPeer,
    "ember socket": lambda size: EmberPeer(size, shared_memory=False, wire="off"),
    "ember socket curve": lambda size: EmberPeer(size, shared_memory=False, wire="curve"),
    "ember socket aead": lambda size: EmberPeer(size, shared_memory=False, wire="aead"),
    "raw pyzmq": RawZmqPeer,
    "gloo": GlooPeer,
}


# ---- the benchmark ------------------------------------------------------------------------------
def measure_size(size: int, repeat: int, iterations: int) -> dict[str, Any]:
    """GB/s of every system and ember's ratio to the best baseline, side by side per repeat."""
    started: dict[str, Any] = {}
    gbps: dict[str, list[float]] = {name: [] for name in SYSTEMS}
    try:
        for name in SYSTEMS:
            started[name] = PEERS[name](size)
        for index in range(repeat):
            turn = index % len(SYSTEMS)
            order = SYSTEMS[turn:] + SYSTEMS[:turn]  # no system always goes first
            for name in order:
                seconds = statistics.median(started[name].measure(iterations))
                gbps[name].append(2 * size * 4 / seconds / 1e9)
    finally:
        for peer in started.values():
            peer.close()
    best = [max(values) for values in zip(*(gbps[name] for name in BASELINES), strict=True)]
    plain = gbps["ember socket"]
    return {
        "floats": size,
        "iterations": iterations,
        "gbps": {name: spread(values) for name, values in gbps.items()},
        "ember_vs_best": spread([e / b for e, b in zip(gbps["ember"], best, strict=True)]),
        "socket_vs_best": spread([e / b for e, b in zip(gbps["ember socket"], best, strict=True)]),
        "socket_vs_gloo": spread(
            [e / g for e, g in zip(gbps["ember socket"], gbps["gloo"], strict=True)]
        ),
        **{
            f"{name}_vs_plain": spread(
                [c / p for c, p in zip(gbps[f"ember socket {name}"], plain, strict=True)]
            )
            for name in ("curve", "aead")
        },
    }


def table(results: dict[str, dict[str, Any]]) -> str:
    headers = [
        "floats",
        "MB each way",
        *(f"{name} GB/s" for name in SYSTEMS),
        "ember / max(raw, gloo)",
        f">= {TARGET}",
        "ember socket / max(raw, gloo)",
        "ember socket / gloo",
        f">= {SOCKET_TARGET}",
        "socket curve / plain",
        "socket aead / plain",
    ]
    rows = []
    for label, result in results.items():
        ratio = result["ember_vs_best"]
        rows.append(
            [
                label,
                f"{result['floats'] * 4 / 1e6:,.1f}",
                *(fmt(result["gbps"][name]) for name in SYSTEMS),
                fmt(ratio),
                check(ratio, TARGET),
                fmt(result["socket_vs_best"]),
                fmt(result["socket_vs_gloo"]),
                check(result["socket_vs_gloo"], SOCKET_TARGET),
                fmt(result["curve_vs_plain"]),
                fmt(result["aead_vs_plain"]),
            ]
        )
    return markdown_table(headers, rows)


def main() -> None:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        nargs="+",
        type=size_label,
        default=None,
        help=f"float32 counts, e.g. 0.27M 10M (default {' '.join(SIZES)})",
    )
    args = parser.parse_args()
    set_threads()
    sizes = args.sizes or (QUICK_SIZES if args.quick else SIZES)
    repeat = 1 if args.quick else args.repeat
    results = {}
    for label in sizes:
        size = parse_size(label)
        results[label] = measure_size(size, repeat, iterations_for(size, args.quick))
        print(
            f"{label}: ember {fmt(results[label]['gbps']['ember'])} GB/s, ratio "
            f"{fmt(results[label]['ember_vs_best'])}; over the socket "
            f"{fmt(results[label]['socket_vs_best'])}, socket / gloo "
            f"{fmt(results[label]['socket_vs_gloo'])}; socket curve / plain "
            f"{fmt(results[label]['curve_vs_plain'])}, aead / plain "
            f"{fmt(results[label]['aead_vs_plain'])}",
            flush=True,
        )
    print()
    settings = {
        "sizes": list(sizes),
        "repeat": repeat,
        "warmup": WARMUP,
        "target": TARGET,
        "socket_target": SOCKET_TARGET,
        "quick": args.quick,
    }
    report("exchange", table(results), settings, results, args.out)


if __name__ == "__main__":
    main()
