"""What the throughput model is given: a Calibration of this machine (bench/calibrate.py
measures one) and the Network its processes run over."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ember.config import CODECS, ConsistencyKind, Strategy

FLOAT_BYTES = 4
INT8_CHUNK = 4096  # values sharing one float32 scale in int8 compression
# The share of float32's bytes an exchange puts on the wire, per RunConfig.compress choice: push
# and pull both compressed; int8 is a byte per value plus a 4-byte scale per INT8_CHUNK values.
WIRE_FRACTION = {"none": 1.0, "fp16": 0.5, "bf16": 0.5, "int8": (1 + 4 / INT8_CHUNK) / 4}
COMPRESSIONS: tuple[str, ...] = CODECS  # RunConfig.compress's choices
# Strategies without a two-worker calibration run of their own wait like one that has it:
# SSP with a small bound waits for the slowest about as often as BSP's rounds do; easgd's and
# diloco's rounds are BSP's, a push and a pull of every parameter each.
_WAITS_LIKE = {
    Strategy.SSP: Strategy.BSP,
    Strategy.EASGD: Strategy.BSP,
    Strategy.DILOCO: Strategy.BSP,
}
# The tau of easgd-async's two-worker calibration run: an exchange every minibatch, so the
# exchange's cost under load is most of the period and is measured precisely.
CALIBRATION_TAU = 1


@dataclass(frozen=True)
class Calibration:
    """What a short local run measured; every figure is per worker and one torch thread."""

    batch_size: int
    t_comp: float  # seconds per minibatch outside exchanges: the loop's wall less its blocking
    parameters: int  # floats in the model
    exchange_wall: float  # seconds per push + pull of all parameters, one client, loopback
    client_cpu: float  # CPU seconds a worker spends on that exchange (its zmq thread included)
    server_cpu: float  # CPU seconds the one server spends on it
    cores: int  # of the calibrating machine
    # (seconds per minibatch, seconds blocked per exchange) of ember's worker loop with two workers
    # (and a server) sharing this host, per strategy measured: async, bsp, ssp, allreduce and
    # easgd-async (at CALIBRATION_TAU)
    on_host: dict[str, tuple[float, float]] = field(default_factory=dict)
    t_eval: float = 0.0  # seconds worker 0 spends on one evaluation of the test set
    # share of float32's bytes an exchange puts on the wire (WIRE_FRACTION); the times above are
    # measured uncompressed
    compression: float = 1.0
    # seconds per float of each codec of ps/codec.py: (encode, decode), measured here
    codecs: dict[str, tuple[float, float]] = field(default_factory=dict)
    codec_cpu: float = 0.0  # seconds each end spends on the codec per exchange (compressed())
    device: str = "cpu"  # where the minibatches were timed: cpu or cuda:N (--device)
    precision: str = "32"  # and in which precision (--precision)

    def compressed(self, compress: str) -> Calibration:
        """These figures for a run with RunConfig.compress = `compress`. Each end of an
        exchange encodes once and decodes twice (ps/compress.py): the worker encodes its push
        and decodes it for its residual or mirror, then decodes the reply; the server decodes
        the push, and encodes its reply and decodes it to fold what the worker will apply."""
        encode, decode = self.codecs.get(compress, (0.0, 0.0))
        cpu = self.parameters * (encode + 2 * decode) if compress != "none" else 0.0
        return replace(self, compression=wire_fraction(compress), codec_cpu=cpu)

    def encrypted(self, cpu_per_byte: float) -> Calibration:
        """These figures across hosts with the payloads encrypted, which on this host went
        through shared memory in clear: each end seals the half of an exchange's bytes it
        sends and opens the half it receives, at `cpu_per_byte` for sealing and opening one
        byte (bench/cipher_probe.py)."""
        added = cpu_per_byte * self.exchange_bytes / 2
        return replace(self, client_cpu=self.client_cpu + added, server_cpu=self.server_cpu + added)

    def sharing(
        self, strategy: str, workers: int, servers: int, tau: float = 1
    ) -> tuple[float, float]:
        """(seconds per minibatch, seconds per exchange) with `workers` workers and `servers`
        servers on this one host: the figures alone for one worker; else the two-worker run
        of the strategy that waits like this one, scaled by how many more processes than that
        run's compete for the cores. easgd-async's exchanger keeps its exchanges off the
        worker's path, so its compute is the figure alone; the cores bound what it shares.

        A synchronous round waits for the slowest worker. What the calibration (one minibatch
        per exchange) blocked beyond the exchange itself is the gap between two workers'
        minibatch times; over tau minibatches of independent jitter that gap is a random
        walk, which grows as sqrt(tau). The measured minibatch shared the cores with an
        exchange every time; of a round's tau minibatches only the one that closes it does,
        and the others compute as the figure alone."""
        mode = Strategy(strategy)
        if mode.overlaps_exchange:
            return self.t_comp, self.exchange_wall
        measured = self.on_host.get(mode) or self.on_host.get(_WAITS_LIKE.get(mode, ""))
        if workers < 2 or measured is None:
            return self.t_comp, self.exchange_wall
        step, blocked = measured
        if mode.consistency is ConsistencyKind.BSP and tau > 1:
            blocked += max(0.0, blocked - self.exchange_wall) * (math.sqrt(tau) - 1)
            step = (step + (tau - 1) * self.t_comp) / tau
        scale = max(1.0, (workers + servers) / (2 + min(servers, 1)))
        return step * scale, blocked * scale

    def exchange_cpu_under_load(self) -> float:
        """CPU seconds one easgd-async exchange costs the host's cores while two workers and a
        server share them: the worker's and the server's own CPU, plus what measuring them
        alone misses (wake-ups, zmq's threads, caches the other processes evict). When the
        calibration kept every core busy, its period at CALIBRATION_TAU is that many
        minibatches plus this cost, spread over the cores."""
        alone = self.client_cpu + self.server_cpu
        measured = self.on_host.get(Strategy.EASGD_ASYNC)
        if measured is None or self.cores > 2:  # cores to spare: the processes did not compete
            return alone
        period = CALIBRATION_TAU * measured[0] + measured[1]  # compute, then the wait for it
        return max(alone, period * self.cores / 2 - CALIBRATION_TAU * self.t_comp)

    @property
    def exchange_bytes(self) -> int:
        """Bytes one exchange moves: all parameters each way, compressed as configured."""
        return round(2 * FLOAT_BYTES * self.parameters * self.compression)


def wire_fraction(compress: str) -> float:
    """The share of float32's bytes a `compress` choice puts on the wire."""
    if compress not in COMPRESSIONS or compress not in WIRE_FRACTION:
        raise ValueError(f"compress {compress!r}: choose from {', '.join(COMPRESSIONS)}")
    return WIRE_FRACTION[compress]


@dataclass(frozen=True)
class LinkExchange:
    """What one exchange alone cost over a link, per byte it moved (bench/exchange_probe.py):
    its wall time beyond the bytes at the link's rate and its latencies (CURVE at both ends,
    the TCP stack, the shaper's pacing), the CPU of each end, and the machine's CPU that no
    process was charged for: the kernel moving the bytes through the emulated hosts' veths,
    bridge and shapers in softirqs, much of it on cores that were otherwise idle."""

    seconds_per_byte: float
    client_cpu_per_byte: float
    server_cpu_per_byte: float
    kernel_cpu_per_byte: float = 0.0


@dataclass(frozen=True)
class Network:
    """Where the processes run. `bandwidth` None means all on this host, over loopback, where
    the calibrated times already include moving the bytes; then `cores` bounds the CPU. With
    a bandwidth and `cores`, the hosts are emulated on one machine of that many cores (network
    namespaces): each link moves the bytes at its rate, but the processes share the cores, so
    each worker computes and waits for the others as the two-worker calibration measured."""

    bandwidth: float | None = None  # bytes per second of each host's link
    latency: float = 0.0  # seconds one way
    cores: int | None = None  # cores shared by every process when on one host (or emulated)
    exchange: LinkExchange | None = None  # what an exchange costs beyond the wire, measured
    burst: float = 0.0  # bytes a shaped link passes at once after idling (a token bucket's)

    def transfer_seconds(self, size: float) -> float:
        """Seconds one transfer of `size` bytes takes at the link's rate, a full bucket's
        `burst` of it let through at once."""
        assert self.bandwidth is not None
        return max(0.0, size - self.burst) / self.bandwidth

    @property
    def emulated(self) -> bool:
        return self.bandwidth is not None and self.cores is not None
