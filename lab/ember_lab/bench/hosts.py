"""The link rows of `ember bench --hosts H --link 1gbit,100mbit`: the comparison on an emulated
cluster of H worker hosts (one core each) and a driver host (ember_lab.emulated), once per
link rate.

Every row's driver runs in host 0 (`ip netns exec`), as a user's would on the cluster's edge:
ember rows as `ember train --engine spark --master spark://...`, read back from summary.json and
metrics.jsonl as the local rows are; MLlib and TorchDistributor rows as `python -m
ember_lab.bench.hosts SPEC OUT`, which writes the row's figures to OUT as JSON. Before the rows of a
rate, a timed bulk TCP transfer between two worker hosts measures what the link carries, and a
TCP ping-pong between a worker host and host 0 (where the servers run) its latency; both go
into the records and the predictions.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from ember.config import FIELD_NAMES, RunConfig
from ember.probe import Dataset
from ember_lab.bench.record import EVALUATIONS, append, eval_config, measure, one_line, run_figures
from ember_lab.bench.rows import BenchSettings, Row, Task, plan_link_rows, tc_rate

ROW_TIMEOUT = 1800.0  # seconds one row may take on the cluster, on shared cores
MEASURE_SECONDS = 3.0  # a link's transfer lasts about this long at its nominal rate
TRANSFER_BYTES = (8 << 20, 512 << 20)  # and moves at least / at most this much
LOCK_WAIT, LOCK_POLL = 1800.0, 15.0  # seconds to wait for another harness to end, and between tries
_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}


def unavailable(settings: BenchSettings) -> str | None:
    """Why the link rows cannot run here, or None."""
    from ember_lab.emulated import netns

    reason = netns.available() or netns.spark_available()
    if reason is None and any(tc_rate(link) for link in settings.links) and not shutil.which("tc"):
        reason = "link rates need tc (iproute2)"
    return reason


def nominal_rate(link: str) -> float | None:
    """A link's rate in bytes per second, None for unlimited."""
    rate = tc_rate(link)
    if rate is None:
        return None
    number, unit = re.fullmatch(r"([\d.]+)([kmg]?)bit", rate).groups()  # type: ignore[union-attr]
    return float(number) * _UNITS[unit] / 8


def transfer_bytes(link: str) -> int:
    rate = nominal_rate(link)
    low, high = TRANSFER_BYTES
    return high if rate is None else int(min(high, max(low, rate * MEASURE_SECONDS)))


def measure_link(cluster: Any, link: str) -> dict[str, Any]:
    """What the link carries: a timed TCP transfer from host 1 to host 2 (or host 0); its
    latency: round trips from host 1 to host 0, as a worker's exchanges go; and what one
    parameter exchange alone costs from host 1 to a server on host 0 (exchange_probe.py)."""
    from ember_lab.bench.exchange_probe import measure_exchange
    from ember_lab.emulated.links import one_way_latency, round_trip, transfer

    receiver = 2 if cluster.hosts > 2 else 0
    done = transfer(cluster, 1, receiver, transfer_bytes(link))
    pings = round_trip(cluster, 1, 0)["seconds"]
    exchange = measure_exchange(cluster, 1, 0)
    return {
        "link": link,
        "bytes": done["bytes"],
        "seconds": done["seconds"],
        "bytes_per_second": done["bytes"] / done["seconds"],
        "nominal_bytes_per_second": nominal_rate(link),
        "round_trips": len(pings),
        "round_trip_seconds": statistics.median(pings),
        "latency_seconds": one_way_latency(pings),
        "exchange": exchange,
    }


def run_link_rows(
    settings: BenchSettings,
    tasks: dict[str, Task],
    calibrations: list[dict[str, Any]],
    records: list[dict[str, Any]],
    log: Any,
    running: Any = None,
) -> dict[str, Any]:
    """Run the link rows into `records` (and results.jsonl); what was measured of each link,
    or why the rows were skipped. On a cluster of its own, or on `running` (a started
    ember_lab.emulated.netns.Cluster of settings.hosts + 1 hosts with Spark), left running."""
    from ember_lab.emulated.netns import Cluster, ClusterError

    reason = unavailable(settings)
    if reason:
        log(f"link rows skipped: {reason}")
        return {"skipped": reason}
    measured: dict[str, Any] = {}
    if running is not None:
        if running.hosts != settings.hosts + 1:
            raise ClusterError(f"the cluster has {running.hosts} hosts, not {settings.hosts + 1}")
        _links(running, settings, tasks, calibrations, records, log, measured)
        return {"hosts": settings.hosts, "measured": measured}
    cluster = Cluster(settings.hosts + 1, settings.out / "cluster-logs", worker_cores=1)
    # the hosts' processes (Spark's daemons, their executors, the drivers) import this ember
    source = str(Path(__file__).resolve().parents[2])
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([source, *([previous] if previous else [])])
    try:
        try:
            _start(cluster, log)
        except ClusterError as error:
            log(f"link rows skipped: {error}")
            return {"skipped": f"the emulated cluster could not be built: {error}"}
        try:
            _links(cluster, settings, tasks, calibrations, records, log, measured)
        finally:
            cluster.close()
    finally:
        if previous is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = previous
    return {"hosts": settings.hosts, "measured": measured}


def _links(
    cluster: Any,
    settings: BenchSettings,
    tasks: dict[str, Task],
    calibrations: list[dict[str, Any]],
    records: list[dict[str, Any]],
    log: Any,
    measured: dict[str, Any],
) -> None:
    """Per link rate: shape every host's link, measure it, run its rows."""
    for link in settings.links:
        for host in range(cluster.hosts):
            cluster.shape(host, tc_rate(link))
        measured[link] = figures = measure_link(cluster, link)
        log(f"link {link}: {8 * figures['bytes_per_second'] / 1e6:,.0f} Mbit/s, "
            f"{figures['latency_seconds'] * 1e3:.3f} ms one way measured")  # fmt: skip
        rows = plan_link_rows(settings, tasks, link)
        mine = []
        for repeat in range(settings.repeat):
            for number, row in enumerate(rows, 1):
                log(f"[{link} {repeat + 1}/{settings.repeat}] {number}/{len(rows)} "
                    f"{row.task.name}: {row.label}")  # fmt: skip
                execute = _on_cluster(cluster, settings)
                record = measure(row, repeat, settings, execute, set())
                record["link_bytes_per_second"] = figures["bytes_per_second"]
                record["link_latency_seconds"] = figures["latency_seconds"]
                record["link_exchange"] = figures["exchange"]
                mine.append(record)
                append(settings.out / "results.jsonl", record)
                log("  " + one_line(record))
        rate, latency = figures["bytes_per_second"], figures["latency_seconds"]
        predict_on_link(
            mine, calibrations, rate, latency, among=[*records, *mine], exchange=figures["exchange"]
        )
        records += mine


def _start(cluster: Any, log: Any) -> None:
    """Start the cluster, waiting (bounded) while another harness holds the one lock."""
    from ember_lab.emulated.netns import ClusterError

    deadline, said = time.monotonic() + LOCK_WAIT, False
    while True:
        try:
            cluster.start()
            return
        except ClusterError as error:
            if "another emulated cluster" not in str(error) or time.monotonic() > deadline:
                raise
            if not said:
                log(f"waiting (at most {LOCK_WAIT:g} s) for the emulated cluster: {error}")
                said = True
            time.sleep(LOCK_POLL)


def predict_on_link(
    records: list[dict[str, Any]],
    calibrations: list[dict[str, Any]],
    bandwidth: float,
    latency: float,
    among: list[dict[str, Any]] | None = None,
    exchange: dict[str, Any] | None = None,
) -> None:
    """The model's figures for rows on a link, at the link's measured rate and latency (and
    the `exchange` exchange_probe measured on it), the emulated hosts sharing this machine's
    cores; the single rows for their time to target are those of `among` (default:
    `records`)."""
    from ember_lab.bench.predict import add_predictions, link_network

    network = link_network(bandwidth, latency, os.cpu_count() or 1, exchange)
    add_predictions(records, calibrations, network=network, among=among)


def _on_cluster(cluster: Any, settings: BenchSettings) -> Any:
    def execute(row: Row, out: Path, dataset: Dataset) -> dict[str, Any]:
        out.parent.mkdir(parents=True, exist_ok=True)
        steps = len(dataset.x_train) // settings.hosts // RunConfig().batch_size
        if row.system == "ember":
            config = replace(eval_config(row, out, dataset), master=cluster.master_url)
            given = config_file(config, out.parent / "config.json")
            argv = [sys.executable, "-m", "ember", "train", "--config", str(given)]
            _run(cluster, argv, f"ember train ({row.label})")
            return run_figures(row, out, config)
        spec = {
            "system": row.system,
            "task": asdict(row.task),
            "master": cluster.master_url,
            "workers": settings.hosts,
            "seed": settings.seed,
            "eval_every": max(1, steps // EVALUATIONS),
        }
        given, result = out.parent / "spec.json", out.parent / "figures.json"
        given.write_text(json.dumps(spec))
        argv = [sys.executable, "-m", "ember_lab.bench.hosts", str(given), str(result)]
        _run(cluster, argv, f"the {row.label} row")
        figures: dict[str, Any] = json.loads(result.read_text())
        return figures

    return execute


def config_file(config: RunConfig, path: Path) -> Path:
    """The fields of `config` that differ from the defaults, as a --config file (JSON is
    YAML)."""
    defaults = RunConfig().to_dict()
    fields = {k: v for k, v in config.to_dict().items() if k in FIELD_NAMES and v != defaults[k]}
    path.write_text(json.dumps(fields, default=str))
    return path


def _run(cluster: Any, argv: list[str], what: str) -> None:
    done = cluster.run(0, argv, env=cluster.env(0), timeout=ROW_TIMEOUT)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        last = lines[-1] if lines else "no output"
        raise RuntimeError(f"{what} in host 0 exited with {done.returncode}: {last}")


def main(argv: list[str]) -> None:
    """In host 0: an MLlib or TorchDistributor row from SPEC, its figures written to OUT."""
    from ember_lab.bench.mllib import bench_session, run_mllib

    spec = json.loads(Path(argv[0]).read_text())
    task = Task(**spec["task"])
    dataset = task.load(spec["seed"])
    with bench_session(spec["workers"], True, master=spec["master"]) as spark:
        if spec["system"] == "mllib":
            figures = run_mllib(
                spark, task.name, dataset, task.mllib_iterations, task.target_metric,
                task.target_value, spec["seed"], task.mllib_segments,
            )  # fmt: skip
        else:
            from ember_lab.bench.distributor import run_distributor

            figures = run_distributor(spark, spec, dataset)
    Path(argv[1]).write_text(json.dumps(figures))


if __name__ == "__main__":
    main(sys.argv[1:])
