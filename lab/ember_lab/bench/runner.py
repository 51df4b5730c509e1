"""Runs the comparison: every row of every task, each measured the same way, into results.jsonl.

A row is Spark MLlib or one ember strategy on one engine. Rows run one after another, so each
has the machine to itself; each is measured from outside (CPU and memory of its whole process
tree) and from its own records (training time, samples, the target metric over time)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ember import __version__
from ember.config import RunConfig, Strategy
from ember.metrics import json_text, write_json
from ember.probe import Dataset
from ember_lab.bench.hosts import run_link_rows
from ember_lab.bench.mllib import bench_session, jvm_pids
from ember_lab.bench.record import Execute, append, measure, one_line, run_ember
from ember_lab.bench.rows import BenchSettings, Row, make_tasks, plan_rows

Log = Callable[[str], None]


def run_bench(
    settings: BenchSettings, log: Log = print, cluster: Any = None
) -> list[dict[str, Any]]:
    """Run every row `settings.repeat` times; return the records also in out/results.jsonl.
    The link rows build an emulated cluster, or run on `cluster` when given."""
    from ember_lab.bench.predict import add_predictions, calibrate_tasks

    tasks = make_tasks(settings.quick, settings.lr_rows, settings.lr_features, settings.epochs)
    settings.validate(tasks)
    settings.out.mkdir(parents=True, exist_ok=True)
    results = settings.out / "results.jsonl"
    results.write_text("")
    rows = plan_rows(settings, tasks)
    calibrations = []  # one per repetition: its predictions see the machine its rows saw
    records: list[dict[str, Any]] = []
    needs_spark = any(r.system == "mllib" or r.engine == "spark" for r in rows)
    with bench_session(settings.workers, needs_spark) as spark:
        for repeat in range(settings.repeat):
            calibrations.append(calibrate_tasks(settings, tasks, log))
            for number, row in enumerate(rows, 1):
                log(
                    f"[{repeat + 1}/{settings.repeat}] {number}/{len(rows)} {row.task.name}: "
                    f"{row.label}"
                )
                local = row.system == "mllib" or row.engine == "spark"
                exclude = set() if local else jvm_pids(spark)
                record = measure(row, repeat, settings, _local(spark, settings), exclude)
                records.append(record)
                append(results, record)
                log("  " + one_line(record))
    add_predictions(records, calibrations)
    settings.wire_run = _wires(settings, calibrations, log)
    links: dict[str, Any] = {"skipped": NO_HOSTS}
    if settings.hosts:
        links = run_link_rows(settings, tasks, calibrations, records, log, cluster)
    settings.links_run = links
    add_divergence(records)
    _rewrite(results, records)
    write_json(
        settings.out / "settings.json",
        {
            **settings.to_dict(),
            "targets": {n: [t.target_metric, t.target_value] for n, t in tasks.items()},
            "calibration": {
                name: [asdict(by_task[name]) for by_task in calibrations]
                for name in (calibrations[0] if calibrations else {})
            },
            "ember_version": __version__,
            "cpus": os.cpu_count(),
        },
    )
    return records


NO_HOSTS = "not asked for: `ember bench --hosts H --link 1gbit,100mbit` runs them, as root"


def _wires(settings: BenchSettings, calibrations: list[Any], log: Log) -> dict[str, Any]:
    """The first task's exchange over the socket in plaintext and under each wire cipher,
    side by side, as an exchange between hosts moves it: {"task", "floats", "wires"}."""
    from ember_lab.bench.cipher_probe import wire_figures

    if not calibrations or not calibrations[0]:
        return {}
    name = next(iter(calibrations[0]))
    floats = calibrations[0][name].parameters
    log(f"timing {name}'s exchange ({floats:,} floats) in plaintext, under CURVE and aead")
    wires = wire_figures(RunConfig(seed=settings.seed), floats, settings.repeat)
    return {"task": name, "floats": floats, "wires": wires}


def _local(spark: Any, settings: BenchSettings) -> Execute:
    """How a row runs on this host: MLlib in the bench's session, ember by its engine."""

    def execute(row: Row, out: Path, dataset: Dataset) -> dict[str, Any]:
        if row.system != "mllib":
            return run_ember(row, out, dataset)
        from ember_lab.bench.mllib import run_mllib

        task = row.task
        return run_mllib(
            spark, task.name, dataset, task.mllib_iterations, task.target_metric,
            task.target_value, settings.seed, task.mllib_segments,
        )  # fmt: skip

    return execute


def add_divergence(records: list[dict[str, Any]]) -> None:
    """d = samples to target / single's samples to target, within a task and repetition (and
    link: a link's own single row, else the local one)."""
    single = {
        (r["task"], r["repeat"], r.get("link")): r["samples_to_target"]
        for r in records
        if r["strategy"] == Strategy.SINGLE
        and (r["engine"] == "local" or r.get("link"))
        and r.get("samples_to_target")
    }
    for r in records:
        key = (r["task"], r["repeat"])
        base = single.get((*key, r.get("link"))) or single.get((*key, None))
        reached = r.get("samples_to_target")
        r["divergence"] = reached / base if base and reached and r["system"] == "ember" else None


def _rewrite(path: Path, records: list[dict[str, Any]]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text("".join(json_text(r) + "\n" for r in records))
    temporary.replace(path)
