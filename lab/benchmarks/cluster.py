"""cluster: ember across emulated hosts (ember_lab.emulated), against the same work on one.

- training: 3-epoch MNIST easgd-async, 2 workers, `ember train` on the local engine against the
  Spark engine on the emulated standalone cluster (driver and servers in host 0, one worker in
  each of hosts 1 and 2, 1 core each, links unlimited); the cluster's wall time less its
  SparkSession start (summary.json's spark.session_seconds). Target: <= 1.3x local. Beside
  it, a running session as a Spark application or notebook has one: a driver in host 0 starts
  a SparkSession on the cluster and calls `ember.fit(engine="spark")` twice; the second call's
  seconds, its executors and their Python workers already up.
- link: push+pull round trips of N floats each way between host 1 (the client) and a
  ParameterServer bound in host 0, both links shaped to each of --link-rates (default 1gbit)
  each way by tc tbf; ember plain, under CURVE and under the aead wire cipher (payloads on the
  socket), against gloo send/recv between the same hosts, and a bulk TCP transfer host 1 to
  host 0 for what the shaped link carries one way. Gbit/s counts both directions' bytes per
  round trip. Targets: encrypted >= 0.9x the link's rate, unencrypted >= 1.0x gloo. With
  --lanes 2 auto, each ember wire also runs striped over 2 sockets, and over what its probe
  chose (--wire-lanes; the client reports the count).
- curve: the wire ciphers' cost on loopback TCP (one namespace, shared memory off): ember under
  CURVE and aead against plain, the same round trips.
- model: the throughput model against the emulated cluster. 1-epoch MNIST mlp runs, 2 workers,
  on the Spark engine across hosts 1 and 2 (servers in host 0): easgd-async at tau 1 and 8, and
  bsp, each predicted by ember_lab.perfmodel from a calibration on this host and the link's rate as
  a bulk TCP transfer from host 1 to host 0 measured it.

--link RATE shapes every host's link (a tc rate, e.g. 100mbit) for the training and model parts;
without it their links are unlimited.

Every pair of peers is a pair of fresh processes (in their hosts' namespaces), told what to do
on stdin, timing with exchange.py's time_round_trips; systems alternate in order per repeat.
Needs root, iproute2, Java and pyspark: without them it prints why and exits 0.

Usage: python lab/benchmarks/cluster.py [--parts training link curve model] [--sizes 1M 25M]
                                    [--epochs E] [--link RATE] [--link-rates 1gbit 10gbit]
                                    [--lanes 1 2 auto] [--repeat R] [--quick] [--out F.json]
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from common import (
    fit_twice_in_session,
    fmt,
    make_parser,
    markdown_table,
    positive_int,
    report,
    set_threads,
    spread,
)
from exchange import TIMEOUT_MS, iterations_for, parse_size, size_label, time_round_trips

PARTS = ("training", "link", "curve", "model")
DEFAULT_PARTS = ("training", "link", "curve")
SIZES = ("1M", "25M")
LINK_RATES = ("1gbit",)
EPOCHS = 3
COMMAND_TIMEOUT = 900.0
WHERE = ("local", "cluster", "running")  # the training part's systems
LINK_SYSTEMS = ("ember", "ember curve", "ember aead", "gloo")
CIPHERS = {"ember": "off", "ember curve": "curve", "ember aead": "aead"}  # each system's wire
GLOO_PORT = 29517
# (strategy, tau) of the model part's rows: the overlapped exchange at its two extremes of
# interest, and the synchronous baseline
MODEL_ROWS = (("easgd-async", 1), ("easgd-async", 8), ("bsp", 1))
LINK_PROBE_SECONDS = 2.0  # of the link's nominal rate, for the transfer that measures it


# ---- peers: one process each, in a host's namespace; a JSON spec on stdin ----------------------
def _peer(spec: dict[str, Any]) -> None:
    set_threads()
    {"server": _ember_server, "client": _ember_client, "gloo": _gloo_rank}[spec["role"]](spec)


def encryption_available() -> bool:
    import ember.probe

    return hasattr(ember.probe, "use_encryption")


def _encryption(cipher: str) -> None:
    """This peer's wire: "off", or encrypted by the wire cipher `cipher`."""
    import ember.probe

    if encryption_available():
        ember.probe.use_encryption(cipher != "off", None if cipher == "off" else cipher)
    elif cipher != "off":
        raise RuntimeError("this ember has no wire encryption (--encrypt)")


def wire_of(system: str) -> tuple[str, str]:
    """(cipher, lane setting) of an ember system: "ember aead", or "ember aead, 2 lanes"."""
    base, _, lanes = system.partition(", ")
    return CIPHERS[base], lanes.split()[0] if lanes else "1"


def with_lanes(systems: tuple[str, ...], lanes: list[str]) -> tuple[str, ...]:
    """`systems`, and each ember one again per lane setting other than 1."""
    striped = [f"{s}, {n} lanes" for n in lanes if n != "1" for s in systems if s in CIPHERS]
    return (*systems, *striped)


def _lanes(setting: str, server: bool = False) -> None:
    """This peer's lanes (wire/lanes.py) where its ember has them, and a server's I/O
    threads as a server process sets them."""
    import ember.probe

    if hasattr(ember.probe, "use_wire_lanes"):
        ember.probe.use_wire_lanes(setting)
        if server:
            ember.probe.use_io_threads(ember.probe.server_io_threads())
    elif setting != "1":
        raise RuntimeError("this ember has no lanes (--wire-lanes)")


def _ember_server(spec: dict[str, Any]) -> None:
    import numpy as np

    _lanes(spec["lanes"], server=True)  # before any socket: the first fixes the I/O threads
    from ember.probe import ParameterServer, SGDRule, ShardSpec, make_consistency

    _encryption(spec["cipher"])
    server = ParameterServer(
        ShardSpec(0, 1, 0, spec["size"]),
        np.zeros(spec["size"], dtype=np.float32),
        SGDRule(lr=0.01, momentum=0.0),
        make_consistency("async"),
        bytes.fromhex(spec["secret"]),
        bind=f"tcp://{spec['bind']}:0",
        worker_timeout=3600.0,
    )
    print(json.dumps({"address": server.address}), flush=True)
    server.serve()


def _ember_client(spec: dict[str, Any]) -> None:
    import numpy as np

    from ember.probe import PSClient, control, shared

    os.environ[shared.DISABLE_VARIABLE] = "0"  # every payload on the socket, as across hosts
    _lanes(spec["lanes"])
    _encryption(spec["cipher"])
    secret = bytes.fromhex(spec["secret"])
    client = PSClient([spec["address"]], secret, worker=0, timeout=TIMEOUT_MS / 1000)
    client.register()
    lanes = getattr(client.connections[0], "lane_count", 1)
    grad = np.random.default_rng(0).standard_normal(spec["size"], dtype=np.float32)
    params = np.empty(spec["size"], dtype=np.float32)
    seconds = time_round_trips(
        lambda: client.push(grad, reply_into=params, pull=True), spec["iterations"]
    )
    client.close()
    control([spec["address"]], secret, "stop")
    print(json.dumps({"seconds": seconds, "lanes": lanes}), flush=True)


def _gloo_rank(spec: dict[str, Any]) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    rank = spec["rank"]
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{spec['master']}:{GLOO_PORT}",
        rank=rank,
        world_size=2,
        timeout=timedelta(milliseconds=TIMEOUT_MS),
    )
    outgoing, incoming = torch.randn(spec["size"]), torch.empty(spec["size"])

    def round_trip() -> None:  # as exchange.py's gloo peers: rank 0 sends, then receives
        if rank == 0:
            dist.send(outgoing, dst=1)
            dist.recv(incoming, src=1)
        else:
            dist.recv(incoming, src=0)
            dist.send(outgoing, dst=0)

    seconds = time_round_trips(round_trip, spec["iterations"])
    dist.destroy_process_group()
    print(json.dumps({"seconds": seconds}), flush=True)


# ---- running peers ------------------------------------------------------------------------------
class Hosts:
    """Where peers run: hosts of an emulated cluster, or this namespace (cluster None)."""

    def __init__(self, cluster: Any = None) -> None:
        self.cluster = cluster

    def start(self, host: int, spec: dict[str, Any]) -> subprocess.Popen[str]:
        argv = [sys.executable, __file__, "--peer"]
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0" if self.cluster else "lo"}
        pipes: dict[str, Any] = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
        if self.cluster is None:
            process = subprocess.Popen(argv, env=env, text=True, **pipes)
        else:
            process = self.cluster.popen(host, argv, env=env, text=True, **pipes)
        assert process.stdin is not None
        process.stdin.write(json.dumps(spec) + "\n")
        process.stdin.close()
        return process

    def address(self, host: int) -> str:
        from ember_lab.emulated.netns import address

        return address(host) if self.cluster else "127.0.0.1"


def _answer(process: subprocess.Popen[str], what: str) -> dict[str, Any]:
    assert process.stdout is not None
    line = process.stdout.readline()  # a peer that hangs is killed by the caller's timeout
    if not line:
        process.wait(30)
        raise RuntimeError(f"the {what} peer exited with {process.returncode} and said nothing")
    answer: dict[str, Any] = json.loads(line)
    return answer


def _end(*processes: subprocess.Popen[str]) -> None:
    for process in processes:
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        if process.stdout is not None:
            process.stdout.close()


def round_trip_seconds(hosts: Hosts, system: str, size: int, iterations: int) -> tuple[float, int]:
    """Median seconds of one round trip of `size` floats each way, client on host 1 (or
    here), and the lanes its connection used (1 for gloo)."""
    common = {"size": size, "iterations": iterations}
    if system == "gloo":
        ranks = [
            hosts.start(host, {**common, "role": "gloo", "rank": rank, "master": hosts.address(0)})
            for rank, host in ((0, 0), (1, 1))
        ]
        try:
            seconds = _answer(ranks[0], "gloo rank 0")["seconds"]
        finally:
            _end(*ranks)
        return statistics.median(seconds), 1
    cipher, lanes = wire_of(system)
    spec = {**common, "cipher": cipher, "lanes": lanes, "secret": os.urandom(32).hex()}
    server = hosts.start(0, {**spec, "role": "server", "bind": hosts.address(0)})
    try:
        address = _answer(server, "ember server")["address"]
        client = hosts.start(1, {**spec, "role": "client", "address": address})
        try:
            answer = _answer(client, "ember client")
        finally:
            _end(client)
    finally:
        _end(server)
    return statistics.median(answer["seconds"]), int(answer.get("lanes", 1))


def compare(
    hosts: Hosts, systems: tuple[str, ...], size: int, repeat: int, quick: bool
) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
    """Gbit/s per system, per repeat, the order rotated so that no system always goes
    first; and the lanes each used."""
    gbit: dict[str, list[float]] = {name: [] for name in systems}
    lanes: dict[str, list[int]] = {name: [] for name in systems}
    for index in range(repeat):
        order = systems[index % len(systems) :] + systems[: index % len(systems)]
        for name in order:
            seconds, used = round_trip_seconds(hosts, name, size, iterations_for(size, quick))
            gbit[name].append(2 * size * 4 * 8 / seconds / 1e9)
            lanes[name].append(used)
    return gbit, lanes


# ---- the three parts ----------------------------------------------------------------------------
def training(cluster: Any, epochs: int, repeat: int) -> dict[str, Any]:
    flags = ["--data", "mnist", "--strategy", "easgd-async", "--workers", "2"]
    flags += ["--epochs", str(epochs)]
    runs: dict[str, list[float]] = {"local": [], "cluster": [], "session": [], "running": []}
    accuracy: dict[str, list[float]] = {"local": [], "cluster": [], "running": []}
    for index in range(repeat):
        turn = index % len(WHERE)
        for where in WHERE[turn:] + WHERE[:turn]:  # no system always goes first
            if where == "running":
                seconds, test_accuracy = fit_twice(cluster, epochs)
                runs["running"].append(seconds)
                accuracy["running"].append(test_accuracy)
                continue
            with tempfile.TemporaryDirectory(prefix="ember-bench-cluster-") as tmp:
                out = ["--out", str(Path(tmp) / "run")]
                command = [sys.executable, "-m", "ember", "train", *flags, *out]
                started = time.perf_counter()
                if where == "local":
                    done = subprocess.run(command, capture_output=True, timeout=COMMAND_TIMEOUT)
                else:
                    command += ["--engine", "spark", "--master", cluster.master_url]
                    done = cluster.run(0, command, env=cluster.env(0), timeout=COMMAND_TIMEOUT)
                wall = time.perf_counter() - started
                if done.returncode != 0:
                    raise RuntimeError(f"{' '.join(command)} failed:\n{str(done.stderr)[-3000:]}")
                summary = json.loads((Path(tmp) / "run" / "summary.json").read_text())
            session = summary["spark"]["session_seconds"] if where == "cluster" else 0.0
            runs[where].append(wall - session)
            runs["session"] += [session] if where == "cluster" else []
            accuracy[where].append(summary["test_accuracy"])
    ratios = [c / lo for c, lo in zip(runs["cluster"], runs["local"], strict=True)]
    running = [r / lo for r, lo in zip(runs["running"], runs["local"], strict=True)]
    return {
        "seconds": {k: spread(v) for k, v in runs.items()},
        "accuracy": {k: spread(v) for k, v in accuracy.items()},
        "ratio": spread(ratios),
        "running_ratio": spread(running),
    }


def fit_twice(cluster: Any, epochs: int) -> tuple[float, float]:
    """A driver in host 0 with one SparkSession on the cluster and two `ember.fit` calls: the
    second call's seconds and test accuracy."""
    with tempfile.TemporaryDirectory(prefix="ember-bench-running-") as tmp:
        command = [sys.executable, __file__, "--fit-twice", tmp, str(epochs), cluster.master_url]
        done = cluster.run(0, command, env=cluster.env(0), timeout=COMMAND_TIMEOUT)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{str(done.stderr)[-3000:]}")
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    return float(answer["seconds"][1]), float(answer["test_accuracy"][1])


def _fit_twice(root: str, epochs: int, master: str) -> None:
    """The driver's side: print the seconds and test accuracy of each call, as JSON."""
    print(json.dumps(fit_twice_in_session(master, Path(root), epochs)), flush=True)


@contextlib.contextmanager
def shaped(cluster: Any, rate: str | None) -> Iterator[None]:
    """Every host's link at `rate` both ways (None: unlimited) while the block runs."""
    hosts = range(cluster.hosts)
    try:
        for host in hosts:
            cluster.shape(host, rate)
        yield
    finally:
        for host in hosts:
            cluster.shape(host, None)


def cluster_summary(cluster: Any, flags: list[str]) -> dict[str, Any]:
    """summary.json of `ember train FLAGS` on the Spark engine, its driver in host 0."""
    with tempfile.TemporaryDirectory(prefix="ember-bench-model-") as tmp:
        command = [sys.executable, "-m", "ember", "train", *flags, "--out", f"{tmp}/run"]
        command += ["--engine", "spark", "--master", cluster.master_url]
        done = cluster.run(0, command, env=cluster.env(0), timeout=COMMAND_TIMEOUT)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{str(done.stderr)[-3000:]}")
        summary: dict[str, Any] = json.loads((Path(tmp) / "run" / "summary.json").read_text())
    return summary


def link_bytes_per_second(cluster: Any, rate: str | None) -> float:
    """Host 1 to host 0 over TCP, as the exchanges go: a couple of seconds' worth of the rate."""
    from ember_lab.emulated.links import transfer
    from ember_lab.perfmodel import parse_bandwidth

    size = int(parse_bandwidth(rate) * LINK_PROBE_SECONDS) if rate else 1 << 30
    result = transfer(cluster, 1, 0, max(size, 1 << 20))
    return float(result["bytes"] / result["seconds"])


def model_check(cluster: Any, rate: str | None, epochs: int) -> dict[str, Any]:
    """Predicted against measured samples/s for MODEL_ROWS on the cluster's links."""
    from ember.config import make_config
    from ember.probe import load_data
    from ember_lab.bench.calibrate import calibrate
    from ember_lab.perfmodel import Network, predict

    config = make_config({"model": "mlp", "data": "mnist"})
    calibration = calibrate(config, load_data(config))  # before the runs: an idle machine
    rows = []
    with shaped(cluster, rate):
        measured_rate = link_bytes_per_second(cluster, rate)
        # the emulated hosts share this machine's cores
        network = Network(bandwidth=measured_rate, cores=calibration.cores)
        for strategy, tau in MODEL_ROWS:
            flags = ["--data", "mnist", "--model", "mlp", "--strategy", strategy]
            flags += ["--workers", "2", "--epochs", str(epochs), "--tau", str(tau)]
            summary = cluster_summary(cluster, flags)
            predicted = predict(strategy, 2, calibration, network, tau=tau)
            measured = summary["samples_per_second"]
            moved = summary["bytes_pushed"] + summary["bytes_pulled"]
            minibatches = max(1, summary["samples"] // calibration.batch_size)
            rows.append(
                {
                    "strategy": strategy,
                    "tau": tau,
                    "measured": measured,
                    "predicted": predicted.samples_per_second,
                    "bound": predicted.bound,
                    "error": (predicted.samples_per_second - measured) / measured,
                    "test_accuracy": summary["test_accuracy"],
                    "bytes_per_exchange": moved / max(1, summary["exchanges"]),
                    # what the run saw: per minibatch computed, and per exchange, its wall
                    # time and the part of it compute waited for
                    "t_comp": summary["t_comp_seconds"] / minibatches,
                    "t_comm": summary["t_comm_seconds"] / max(1, summary["exchanges"]),
                    "t_wait": summary.get("t_wait_seconds", 0.0) / max(1, summary["exchanges"]),
                }
            )
    return {
        "rate": rate or "unlimited",
        "measured_bytes_per_second": measured_rate,
        "calibration": asdict(calibration),
        "rows": rows,
    }


def link(
    cluster: Any, rate: str, sizes: list[str], repeat: int, quick: bool, systems: tuple[str, ...]
) -> dict[str, Any]:
    """The systems' round trips on links shaped to `rate`: Gbit/s, and each encrypted
    system's against the rate, per size; "tcp": a bulk transfer's Gbit/s one way."""
    from ember_lab.perfmodel import parse_bandwidth

    link_gbit = parse_bandwidth(rate) * 8 / 1e9
    cluster.shape(0, rate)
    cluster.shape(1, rate)
    try:
        results: dict[str, Any] = {"tcp": link_bytes_per_second(cluster, rate) * 8 / 1e9}
        for label in sizes:
            gbit, lanes = compare(Hosts(cluster), systems, parse_size(label), repeat, quick)
            results[label] = {
                "gbit": {k: spread(v) for k, v in gbit.items()},
                "lanes": lanes,
                "plain_vs_gloo": spread(
                    [e / g for e, g in zip(gbit["ember"], gbit["gloo"], strict=True)]
                ),
                "vs_link": {
                    name: spread([g / link_gbit for g in gbit[name]])
                    for name in gbit
                    if name != "gloo"
                },
            }
        return results
    finally:
        cluster.shape(0, None)
        cluster.shape(1, None)


def curve(sizes: list[str], repeat: int, quick: bool, systems: tuple[str, ...]) -> dict[str, Any]:
    results = {}
    for label in sizes:
        gbit, used = compare(Hosts(), systems, parse_size(label), repeat, quick)
        results[label] = {"gbit": {k: spread(v) for k, v in gbit.items()}, "lanes": used}
        results[label]["vs_plain"] = {
            name: spread([e / p for e, p in zip(gbit[name], gbit["ember"], strict=True)])
            for name in systems[1:]
        }
    return results


# ---- output -------------------------------------------------------------------------------------
def tables(results: dict[str, Any]) -> str:
    parts = []
    if "training" in results:
        r = results["training"]
        ratio, seconds, accuracy = r["ratio"], r["seconds"], r["accuracy"]
        meets = "yes" if ratio["median"] <= 1.3 else "**no**"
        rows = [
            ["local engine", fmt(seconds["local"]), fmt(accuracy["local"], 4), "1"],
            [f"2-host standalone cluster, session start ({fmt(seconds['session'])} s) excluded",
             fmt(seconds["cluster"]), fmt(accuracy["cluster"], 4), f"{fmt(ratio)} ({meets})"],
        ]  # fmt: skip
        if seconds.get("running"):
            running = r["running_ratio"]
            meets = "yes" if running["median"] <= 1.3 else "**no**"
            rows.append([
                "2-host standalone cluster, running session: second `ember.fit(engine=\"spark\")`",
                fmt(seconds["running"]), fmt(accuracy["running"], 4), f"{fmt(running)} ({meets})",
            ])  # fmt: skip
        heads = ["3-epoch MNIST easgd-async, 2 workers", "seconds", "test accuracy"]
        parts.append(markdown_table([*heads, "ratio (<= 1.3)"], rows))
    for rate, by_size in results.get("link", {}).items():
        sizes = {label: r for label, r in by_size.items() if label != "tcp"}
        systems = list(next(iter(sizes.values()))["gbit"]) if sizes else []
        encrypted = [n for n in systems if n != "gloo" and wire_of(n)[0] != "off"]
        rows = [
            [label, *(_cell(r["gbit"], n) for n in systems),
             *(_cell(r["vs_link"], n) for n in encrypted), fmt(r["plain_vs_gloo"])]
            for label, r in sizes.items()
        ]  # fmt: skip
        heads = ["floats each way", *(f"{n} Gbit/s" for n in systems)]
        heads += [*(f"{n} / link (>= 0.9)" for n in encrypted), "ember / gloo (>= 1.0)"]
        tcp = f"a bulk TCP transfer moved {by_size['tcp']:.2f} Gbit/s one way"
        table = markdown_table(heads, rows) + _chosen(sizes)
        parts.append(f"hosts 0 and 1 on a {rate} tbf link ({tcp}):\n\n" + table)
    if "curve" in results:
        by_size = results["curve"]
        systems = list(next(iter(by_size.values()))["gbit"])
        rows = [
            [label, *(fmt(r["gbit"][n]) for n in systems),
             *(fmt(r["vs_plain"][n]) for n in systems[1:])]
            for label, r in by_size.items()
        ]  # fmt: skip
        heads = ["floats each way", *(f"{n} Gbit/s" for n in systems)]
        heads += [f"{n} / plain" for n in systems[1:]]
        table = markdown_table(heads, rows) + _chosen(by_size)
        parts.append("loopback TCP, shared memory off:\n\n" + table)
    if "model" in results:
        r = results["model"]
        rows = [
            [f"{m['strategy']}" + (f" tau={m['tau']}" if m["strategy"] != "bsp" else ""),
             f"{m['measured']:,.0f}", f"{m['predicted']:,.0f} ({m['bound']})",
             f"{m['error']:+.1%}", f"{m['bytes_per_exchange'] / 1e6:.2f}",
             f"{m['t_comp'] * 1e3:.2f} / {m['t_comm'] * 1e3:.1f} / {m['t_wait'] * 1e3:.1f}",
             f"{m['test_accuracy']:.4f}"]
            for m in r["rows"]
        ]  # fmt: skip
        heads = ["2 workers, MNIST mlp", "measured samples/s", "predicted (bound)", "error"]
        heads += ["MB per exchange", "T_comp / T_comm / waited (ms)", "test accuracy"]
        rate = r["measured_bytes_per_second"] * 8 / 1e6
        parts.append(
            f"links at {r['rate']} (measured {rate:,.1f} Mbit/s host 1 to host 0):\n\n"
            + markdown_table(heads, rows)
        )
    return "\n\n".join(parts)


def _chosen(by_size: dict[str, Any]) -> str:
    """What the probes of the auto systems chose, per size and repeat."""
    lines = [
        f"- {label}, {name}: {', '.join(map(str, used))}"
        for label, r in by_size.items()
        for name, used in r.get("lanes", {}).items()
        if name.endswith("auto lanes")
    ]
    return "\n\nlanes each auto probe chose:\n\n" + "\n".join(lines) if lines else ""


def _cell(figures: dict[str, Any], name: str) -> str:
    return fmt(figures[name]) if name in figures else "n/a"


def unavailable() -> str | None:
    from ember_lab.emulated import netns

    return netns.available() or netns.spark_available()


def main() -> None:
    if sys.argv[1:] == ["--peer"]:
        _peer(json.loads(sys.stdin.readline()))
        return
    if sys.argv[1:2] == ["--fit-twice"]:
        _fit_twice(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(DEFAULT_PARTS))
    parser.add_argument("--sizes", nargs="+", type=size_label, default=None)
    parser.add_argument("--epochs", type=positive_int, default=EPOCHS)
    parser.add_argument("--link", default=None, help="a tc rate for the training and model parts")
    parser.add_argument(
        "--link-rates", nargs="+", default=list(LINK_RATES), help="tc rates for the link part"
    )
    parser.add_argument(
        "--lanes", nargs="+", default=["1"], help="lane settings for the link and curve parts"
    )
    args = parser.parse_args()
    reason = unavailable()
    if reason:
        print(f"cluster: skipped: {reason}")
        return
    from ember_lab.emulated.netns import Cluster

    quick = args.quick
    repeat, epochs = (1, 1) if quick else (args.repeat, args.epochs)
    sizes = args.sizes or (["1M"] if quick else list(SIZES))
    results: dict[str, Any] = {}
    systems = with_lanes(LINK_SYSTEMS, args.lanes)
    if not encryption_available():
        print("cluster: this ember has no --encrypt: no encrypted figures, no curve part")
        systems = tuple(name for name in systems if name == "gloo" or wire_of(name)[0] == "off")
    elif "curve" in args.parts:
        results["curve"] = curve(sizes, repeat, quick, with_lanes(LINK_SYSTEMS[:3], args.lanes))
    if {"training", "link", "model"} & set(args.parts):
        with (
            tempfile.TemporaryDirectory(prefix="ember-bench-hosts-") as logs,
            Cluster(3, Path(logs), worker_cores=1) as cluster,
        ):
            if "training" in args.parts:
                with shaped(cluster, args.link):
                    results["training"] = training(cluster, epochs, repeat)
            if "model" in args.parts:
                results["model"] = model_check(cluster, args.link, 1)
            if "link" in args.parts:
                rates = args.link_rates[:1] if quick else args.link_rates
                results["link"] = {
                    rate: link(cluster, rate, sizes, repeat, quick, systems) for rate in rates
                }
    settings = {"parts": args.parts, "sizes": sizes, "repeat": repeat, "epochs": epochs}
    settings.update(link_rates=args.link_rates, training_link=args.link or "unlimited", quick=quick)
    settings["lanes"] = args.lanes
    print()
    report("cluster", tables(results), settings, results, args.out)


if __name__ == "__main__":
    main()
