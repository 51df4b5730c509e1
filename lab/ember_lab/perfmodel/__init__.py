"""The throughput model behind `ember plan`: DeepSpark's compute/communication trade-off.

A worker computes tau minibatches (tau * T_comp), then exchanges its parameters (or gradients)
with the servers (T_comm). Throughput is n * tau * batch / period, where the period is the
longest of what bounds it:

- the worker's own path: tau * T_comp + T_comm, or max(tau * T_comp, T_comm) when an exchanger
  thread overlaps the exchange with compute (easgd-async);
- each server's share of the exchanges: n workers' requests land on every shard, which handles
  1/S of the bytes of each;
- on one host, the cores: every process's CPU seconds per period, divided among the cores;
- over a network, each server link carries 2 * bytes / S per worker per period: in turns under
  BSP (every push, then every reply), and as a queue where asynchronous exchanges meet.

A larger tau raises throughput but lets workers drift apart, so a distributed run needs more
samples than `single` to reach the same target: the divergence penalty d = samples to target /
single's samples to target, measured by `ember bench`. Time to target is then
d * single's samples / throughput, and the speedup that matters is n / d for a large tau.

imports: units; and ember's public names
"""

from __future__ import annotations

import math
from dataclasses import replace

from ember.config import STRATEGIES, AlgorithmKind, ConsistencyKind, Strategy
from ember_lab.perfmodel.fragments import fragment_calibration, fragments_prediction
from ember_lab.perfmodel.inputs import CALIBRATION_TAU as CALIBRATION_TAU
from ember_lab.perfmodel.inputs import COMPRESSIONS as COMPRESSIONS
from ember_lab.perfmodel.inputs import FLOAT_BYTES as FLOAT_BYTES
from ember_lab.perfmodel.inputs import INT8_CHUNK as INT8_CHUNK
from ember_lab.perfmodel.inputs import WIRE_FRACTION as WIRE_FRACTION
from ember_lab.perfmodel.inputs import Calibration as Calibration
from ember_lab.perfmodel.inputs import LinkExchange as LinkExchange
from ember_lab.perfmodel.inputs import Network as Network
from ember_lab.perfmodel.inputs import wire_fraction as wire_fraction
from ember_lab.perfmodel.prediction import Prediction as Prediction
from ember_lab.perfmodel.run import closing_seconds as closing_seconds
from ember_lab.perfmodel.run import evaluation_wait as evaluation_wait
from ember_lab.units import parse_bandwidth as parse_bandwidth
from ember_lab.units import parse_bandwidths as parse_bandwidths
from ember_lab.units import parse_counts as parse_counts
from ember_lab.units import parse_latency as parse_latency

MAX_TAU = 256  # the largest period model_tau names, as `--tau auto` clamps its own
AUTO_MARGIN = 1.25  # `--tau auto`'s margin of compute over an exchange (algorithms/period.py)
# an asynchronous server link's queue is named as the bound only when it is this much longer
# than the worker's own path
BOUND_MARGIN = 0.05
# The mean rest of a transfer in service, as a share of one, that a transfer arriving on a busy
# link waits for: a half, since every exchange moves the same bytes (a memoryless service: 1).
RESIDUAL = 0.5


def predict(
    strategy: str,
    workers: int,
    calibration: Calibration,
    network: Network,
    tau: float = 1,
    servers: int = 1,
    fragments: int = 1,
) -> Prediction:
    """Predicted samples/s of `strategy` on `workers` workers; tau is easgd's communication
    period and sgd's n_push (both: minibatches between exchanges; a mean one for a run whose
    tau moved). `fragments` above 1 is diloco's Streaming DiLoCo (perfmodel/fragments.py)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")
    if fragments > 1:
        if strategy != Strategy.DILOCO:
            raise ValueError(f"fragments apply to diloco only, not {strategy!r}")
        part = fragment_calibration(calibration, fragments)
        stagger_servers = max(1, servers // fragments)
        round_ = predict(Strategy.DILOCO, workers, part, network, tau / fragments, stagger_servers)
        return fragments_prediction(round_, part, tau, servers, fragments)
    mode = Strategy(strategy)
    algorithm, consistency = mode.algorithm, mode.consistency
    c, n = _on_link(calibration, network), workers
    if algorithm is AlgorithmKind.SINGLE:
        n, tau, servers = 1, 1, 1
    if algorithm is AlgorithmKind.ALLREDUCE:
        tau, servers = 1, 1
    # On one host, processes slow each other down; over a network each has a host to itself,
    # unless the hosts are emulated on one machine, where the calibration's slowdown and waits
    # (beyond its exchange, which the link now takes the place of) hold as they did there.
    wait = 0.0
    if network.bandwidth is None:
        t_step, t_exchange = c.sharing(strategy, n, servers if mode.uses_server else 0, tau)
    elif network.emulated and not mode.overlaps_exchange:
        t_step, blocked = c.sharing(strategy, n, servers if mode.uses_server else 0, tau)
        t_exchange, wait = c.exchange_wall, max(0.0, blocked - c.exchange_wall)
    elif network.emulated and n > 1:  # the exchanger overlaps: steps as two workers' go here
        t_step, t_exchange = c.on_host.get(Strategy.ASYNC, (c.t_comp, 0.0))[0], c.exchange_wall
    else:
        t_step, t_exchange = c.t_comp, c.exchange_wall
    compute = tau * t_step
    candidates: dict[str, float] = {}
    if algorithm is AlgorithmKind.SINGLE:
        t_comm = 0.0
        candidates["worker"] = tau * c.t_comp
    elif algorithm is AlgorithmKind.ALLREDUCE:
        t_comm = _allreduce_seconds(c, network, n, t_exchange)
        t_comm += _core_wait(_scaled(c.client_cpu, n), network, n - 1)  # as async's, below
        candidates["worker"] = compute + wait + t_comm
        if network.bandwidth is None:
            candidates["cpu"] = n * (tau * c.t_comp + _scaled(c.client_cpu, n)) / _cores(c, network)
    else:
        # each shard handles 1/S of every exchange, and decodes and encodes its part
        server_share = (c.server_cpu + c.codec_cpu) / servers
        # the workers computing while one exchanges: easgd-async's exchanger overlaps its own
        computing = n if mode.overlaps_exchange else n - 1
        off_links = _off_links(c, network, computing, servers)  # nobody shares that part
        t_comm = _exchange_seconds(c, network, servers, t_exchange) + off_links
        if mode.overlaps_exchange:  # the exchanger thread's CPU comes out of compute's
            compute += c.client_cpu + c.codec_cpu
            candidates["worker"] = max(compute, t_comm)
        else:
            candidates["worker"] = compute + wait + t_comm
        # A shard answers requests one after another: n of them per period keep it busy.
        candidates["server"] = n * server_share
        if consistency is ConsistencyKind.BSP:
            # A round closes after the server took every worker's push, one after another.
            # The two-worker calibration's wait holds the server's work as it measured it
            # (full precision, through shared memory); a codec's and a link's come on top.
            seen = calibration.server_cpu / servers if Strategy.BSP in c.on_host else 0.0
            candidates["worker"] += (n - 1) * max(0.0, server_share - seen)
        if network.bandwidth is None or network.emulated:  # every process on the same cores
            exchange_cpu = c.client_cpu + c.server_cpu  # on a link, as it measured them
            if mode.overlaps_exchange:
                # its compute overlaps, so the cores bound it at what an exchange costs them
                # beside two computing workers: as much more than alone (wake-ups, evicted
                # caches) as the two-worker calibration measured through shared memory
                alone = calibration.client_cpu + calibration.server_cpu
                under_load = calibration.exchange_cpu_under_load()
                exchange_cpu = exchange_cpu * under_load / alone if alone > 0 else under_load
            # a step's CPU, as measured alone: the slower steps of workers sharing the cores
            # are what this bound divides among them, not more CPU
            per_worker = tau * c.t_comp + exchange_cpu + 2 * c.codec_cpu + _kernel_cpu(c, network)
            candidates["cpu"] = n * per_worker / _cores(c, network)
        # on one host the calibrated times moved the bytes already
        if network.bandwidth is not None and consistency is ConsistencyKind.BSP:
            # A server's link carries every push in and every reply out. A BSP round takes
            # all pushes before a reply leaves, so the two directions take turns (each one's
            # bucket fills while the other has its turn), and the workers compute in step
            # between the rounds: no core is computing while the round's bytes move.
            turns = 2 * network.transfer_seconds(n * c.exchange_bytes / 2 / servers)
            off_round = _beyond_wire(c, network) + _codec_seconds(c, servers)
            candidates["network"] = compute + wait + turns + off_round
        elif network.bandwidth is not None:  # asynchronous exchanges queue where they meet
            # the exchanger sends again as soon as a reply is in, the others after computing
            think = (0.0 if mode.overlaps_exchange else compute + wait) + off_links
            candidates["network"] = shared_link_cycle(c, network, n, servers, think)
    bound = max(candidates, key=lambda k: candidates[k])
    period = candidates[bound]
    rest = [k for k in candidates if k != "network"]
    queue_only = bound == "network" and consistency is not ConsistencyKind.BSP
    if queue_only and period < (1 + BOUND_MARGIN) * max(candidates[k] for k in rest):
        # a queue that adds little to a worker's own path does not yet bound it
        bound = max(rest, key=lambda k: candidates[k])
    throughput = n * tau * c.batch_size / period if period > 0 else float("inf")
    return Prediction(
        strategy, n, servers, tau, throughput, period, t_comm, bound, compute, candidates
    )


def model_tau(
    calibration: Calibration,
    network: Network,
    workers: int = 2,
    servers: int = 1,
    margin: float = 1.0,
) -> int:
    """The tau `--tau auto` picks for easgd-async on this link: the smallest whose compute
    covers the exchange, tau * T_comp >= margin * T_comm, clamped to 1..MAX_TAU. T_comm is what
    a worker sees an exchange take at tau 1: its own link's time, or longer when the server's
    link or CPU is the slower, since the exchanges of all workers queue there."""
    at_one = predict(Strategy.EASGD_ASYNC, workers, calibration, network, 1, servers)
    shared = [at_one.bounds.get(k, 0.0) for k in ("network", "server")]
    exchange = max(at_one.t_comm, *shared)
    # a step's compute: a period's compute holds the exchange's own CPU once, whatever tau is
    # (on a link, what the link adds to it too), so two periods' difference is one step
    at_two = predict(Strategy.EASGD_ASYNC, workers, calibration, network, 2, servers)
    t_comp = at_two.compute - at_one.compute
    if t_comp <= 0:
        return MAX_TAU
    return max(1, min(MAX_TAU, math.ceil(margin * exchange / t_comp - 1e-9)))


def shared_link_cycle(
    c: Calibration, network: Network, workers: int, servers: int, think: float
) -> float:
    """Seconds between one worker's exchanges when `workers` exchange asynchronously over the
    servers' links: mean value analysis (Reiser and Lavenberg, 1980) of a closed network. Each
    worker spends `think` seconds away from the links, then its push crosses every shard's
    inbound link and the reply their outbound ones. A transfer that finds a direction busy
    waits, on average, for the rest of the one in service: every exchange is the same size and
    the link's queue (tc's token bucket) serves bytes in order, so that is half a transfer, not
    a whole one as a memoryless service would charge (Reiser's residual-time correction). With
    many workers the cycle tends to n * P / (S * bandwidth), each direction of a server's link
    full; two workers with nothing between their exchanges cycle in 1.25 exchanges alone."""
    assert network.bandwidth is not None
    one_way = network.transfer_seconds(c.exchange_bytes / 2)  # the push, or the reply
    demand = one_way / servers  # on each shard's link, each direction
    # the rest of the worker's own link's time, the latencies and the codec: nobody shares them
    alone = think + 2 * network.latency + 2 * (one_way - demand) + _codec_seconds(c, servers)
    queued, busy = [0.0, 0.0], [0.0, 0.0]  # mean transfers at, and use of, each direction
    cycle = alone + 2 * demand
    for m in range(1, workers + 1):
        response = [
            demand * (1 + q - u * (1 - RESIDUAL)) for q, u in zip(queued, busy, strict=True)
        ]
        cycle = alone + sum(response)
        queued = [m / cycle * r for r in response]
        busy = [m / cycle * demand] * 2
    return cycle


def _cores(c: Calibration, network: Network) -> int:
    return network.cores if network.cores is not None else c.cores


def _codec_seconds(c: Calibration, servers: int) -> float:
    """What the codec adds to an exchange: the worker's part, then each shard's in parallel.
    Neither overlaps the wire: a push is encoded whole before it leaves, and decoded whole
    once in, and so is a reply."""
    return c.codec_cpu * (1 + 1 / servers)


def _exchange_seconds(c: Calibration, network: Network, servers: int, on_host: float) -> float:
    """One worker's push + pull: the client's part, and each shard's part done in parallel.
    `on_host` is the exchange's time on one host with one server."""
    server_part = c.server_cpu / servers
    codec = _codec_seconds(c, servers)
    if network.bandwidth is None:
        return max(on_host - c.server_cpu, 0.0) + server_part + codec
    # ZeroMQ pipelines the chunks with the work; the push, then the reply
    wire = 2 * network.transfer_seconds(c.exchange_bytes / 2)
    return 2 * network.latency + max(wire, c.client_cpu + server_part) + codec


def _off_links(c: Calibration, network: Network, computing: int, servers: int) -> float:
    """What a parameter exchange spends beyond the wire's time, measured on the link (CURVE,
    the TCP stack), plus, on emulated hosts, waiting for a core (_core_wait) while
    `computing` workers compute."""
    cpu = c.client_cpu + c.server_cpu / servers + _codec_seconds(c, servers)
    return _beyond_wire(c, network) + _core_wait(cpu, network, computing)


def _beyond_wire(c: Calibration, network: Network) -> float:
    """What the link's probe measured an exchange of c's bytes to take beyond the wire."""
    measured = network.exchange
    return 0.0 if measured is None else measured.seconds_per_byte * c.exchange_bytes


def _kernel_cpu(c: Calibration, network: Network) -> float:
    """The machine's CPU for an exchange of c's bytes that no process is charged for, as the
    link's probe measured it: on emulated hosts it comes out of the same cores."""
    measured = network.exchange
    return 0.0 if measured is None else measured.kernel_cpu_per_byte * c.exchange_bytes


def _core_wait(cpu: float, network: Network, computing: int) -> float:
    """What an exchange's `cpu` seconds (each end's, codec included) add to its wall time on
    emulated hosts. Alone, that work hides under the wire's time (the probe measured it so);
    beside `computing` threads that keep cores busy, the exchange's two ends get a fair share
    of the cores, so it takes (computing + 2) / cores times as long."""
    if not network.emulated or network.cores is None:
        return 0.0
    return cpu * max(0.0, (computing + 2) / network.cores - 1)


def _on_link(c: Calibration, network: Network) -> Calibration:
    """The calibration with each end's CPU for an exchange as the link was measured to take
    it: on a link, CURVE and the TCP stack work on every byte moved. What an exchange does
    per parameter (copies, the server's rule) is the same with or without a codec, as the
    figures through shared memory measured it; what the link added over those figures, per
    byte the probe moved, shrinks with the bytes a codec leaves."""
    measured = network.exchange
    if measured is None:
        return c
    full = 2 * FLOAT_BYTES * c.parameters  # an uncompressed exchange's bytes

    def on_link(shared_memory_cpu: float, link_cpu_per_byte: float) -> float:
        added = max(0.0, link_cpu_per_byte - shared_memory_cpu / full)
        return shared_memory_cpu + added * c.exchange_bytes

    return replace(
        c,
        client_cpu=on_link(c.client_cpu, measured.client_cpu_per_byte),
        server_cpu=on_link(c.server_cpu, measured.server_cpu_per_byte),
    )


def _scaled(two_process_figure: float, n: int) -> float:
    """A ring all-reduce moves 2(n-1)/n of the parameters per process; calibrated at n = 2."""
    return two_process_figure * (2 * (n - 1) / n) if n > 1 else 0.0


def _allreduce_seconds(c: Calibration, network: Network, n: int, on_host: float) -> float:
    """A ring all-reduce; its CPU per byte is taken to be a parameter exchange's, unless the
    two-worker loop measured it (`on_host`) on this host."""
    if n == 1:
        return 0.0
    if network.bandwidth is None:
        return _scaled(on_host, n)
    wire = 2 * (n - 1) / n * FLOAT_BYTES * c.parameters / network.bandwidth
    return 2 * (n - 1) * network.latency + max(wire, _scaled(c.client_cpu, n))


def time_to_target(
    prediction: Prediction | float, single_samples: float, divergence: float
) -> float:
    """Seconds to the target: d times the samples `single` needed, at the predicted speed
    (a Prediction, or samples per second)."""
    rate = prediction.samples_per_second if isinstance(prediction, Prediction) else prediction
    return divergence * single_samples / rate
