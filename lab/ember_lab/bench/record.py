"""One row of the comparison, run and recorded: its config, its figures (from the run's summary
and metrics), and its record, measured from outside (CPU and memory of its process tree)."""

from __future__ import annotations

import json
import math
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ember import __version__
from ember.config import RunConfig
from ember.metrics import json_text, read_records
from ember.metrics.records import Evaluation, TauChoice
from ember.probe import Dataset
from ember_lab.bench.measure import TreeSampler
from ember_lab.bench.rows import BenchSettings, Row

EVALUATIONS = 8  # a row's evaluation points an epoch, for its curve and time to target
FIGURES = (
    "test_accuracy", "test_loss", "samples", "train_seconds", "samples_per_second",
    "seconds_per_epoch", "bytes_per_sample", "t_comp_seconds", "t_comm_seconds", "curve",
    "config", "train_samples", "test_samples", "features", "tau_choices",
)  # fmt: skip


def run_ember(row: Row, out: Path, dataset: Dataset) -> dict[str, Any]:
    """Train one ember row in its own run directory; figures from its summary and metrics."""
    from ember.probe import ParsedRun, engine_named

    config = eval_config(row, out, dataset)
    ParsedRun(config, show_progress=False).execute(engine_named(config.engine))
    return run_figures(row, out, config)


def eval_config(row: Row, out: Path, dataset: Dataset) -> RunConfig:
    """The row's config for a run in `out`: worker 0 copies the parameters EVALUATIONS times
    an epoch and evaluates the copies on the whole test set after training, so a row's time
    to target is neither paused by evaluation nor read off a sample of the test set."""
    assert row.config is not None
    steps_per_epoch = len(dataset.x_train) // row.config.workers // row.config.batch_size
    every = max(1, steps_per_epoch // EVALUATIONS)
    return replace(row.config, out=str(out), eval_every=every, eval_deferred=True)


def run_figures(row: Row, out: Path, config: RunConfig) -> dict[str, Any]:
    """A finished run's figures, from its summary.json and metrics.jsonl. A run that had to
    retry its training (a Spark stage attempt, a restarted worker) is a failed row: its clock
    and samples start again with the retry, so its figures compare with no other row's."""
    summary = json.loads((out / "summary.json").read_text())
    attempts = (summary.get("spark") or {}).get("stage_attempts", 1)
    restarts = summary.get("worker_restarts") or 0
    if attempts > 1 or restarts:
        raise RuntimeError(
            f"the run retried its training ({attempts} stage attempts, {restarts} worker "
            "restarts), so its clock and samples mix attempts"
        )
    curve = []
    chosen: dict[tuple[str, int], list[list[int]]] = {}  # (rank, incarnation) -> its choices
    for record in read_records(out / "metrics.jsonl"):
        if isinstance(record, Evaluation):
            metric = record.scores[row.task.target_metric]
            curve.append([record.seconds, record.samples, metric])
        elif isinstance(record, TauChoice):  # a period chosen (auto, loss): [local step, tau]
            start = (str(record.rank), record.incarnation)
            chosen.setdefault(start, []).append([record.step, record.tau])
    # each worker's periods as its first start chose them (a Spark task's incarnation is its
    # attempt id: the lowest is the first)
    periods = {rank: chosen[rank, min(i for r, i in chosen if r == rank)] for rank, _ in chosen}
    # The run's own figure, on the final parameters (the servers', for server strategies).
    curve.append([summary["train_seconds"], summary["samples"], summary[row.task.target_metric]])
    samples = summary["samples"]
    moved = summary.get("bytes_pushed", 0) + summary.get("bytes_pulled", 0)
    return {
        "test_accuracy": summary["test_accuracy"],
        "test_loss": summary["test_loss"],
        "samples": samples,
        "train_seconds": summary["train_seconds"],
        "samples_per_second": summary["samples_per_second"],
        "seconds_per_epoch": summary["train_seconds"] / config.epochs,
        "bytes_per_sample": moved / samples if samples else None,
        "t_comp_seconds": summary.get("t_comp_seconds"),
        "t_comm_seconds": summary.get("t_comm_seconds"),
        "curve": curve,
        "config": config.to_dict(),
        **({"tau_choices": periods} if periods else {}),
    }


Execute = Callable[[Row, Path, Dataset], dict[str, Any]]


def append(results: Path, record: dict[str, Any]) -> None:
    with results.open("a") as stream:  # a later crash keeps the rows already run
        stream.write(json_text(record) + "\n")


def measure(
    row: Row, repeat: int, settings: BenchSettings, execute: Execute, exclude: set[int]
) -> dict[str, Any]:
    """One row's record: run by `execute`, sampled from outside, its target reached when."""
    record: dict[str, Any] = {
        "kind": "row",
        "task": row.task.name,
        "row": row.label,
        "system": row.system,
        "strategy": row.config.strategy if row.config else None,
        "engine": row.engine,
        "workers": row.config.workers
        if row.config
        else (settings.hosts if row.link else settings.workers),
        "tau": row.config.tau if row.config and row.config.mode.periodic else None,
        "sweep": row.sweep,
        "repeat": repeat,
        "status": "ok",
        "error": None,
        "target_metric": row.task.target_metric,
        "target_value": row.task.target_value,
        "data": row.task.data,
        "epochs": None if row.system == "mllib" else row.task.epochs,
        "iterations": row.task.mllib_iterations if row.system == "mllib" else None,
        "link": row.link,
        "hosts": settings.hosts if row.link else None,
        "ember_version": __version__,
        **dict.fromkeys(FIGURES),  # None until measured; some never are for some rows
    }
    started = time.perf_counter()
    with TreeSampler(exclude) as sampler, tempfile.TemporaryDirectory(prefix="ember-bench-") as tmp:
        try:
            dataset = row.task.load(settings.seed)
            record.update(
                train_samples=len(dataset.x_train),
                test_samples=len(dataset.x_test),
                features=math.prod(dataset.input_shape),
            )
            figures = execute(row, Path(tmp) / "run", dataset)
            record.update(figures)
        except Exception as exc:  # one failed row is reported, and the others still run
            record.update(status="failed", error=f"{type(exc).__name__}: {exc}".splitlines()[0])
            record["traceback"] = traceback.format_exc()
    record["wall_seconds"] = time.perf_counter() - started
    record.update(sampler.figures())
    hit = first_reached(row, record.get("curve") or [])
    record["time_to_target"] = hit[0] if hit else None
    record["samples_to_target"] = hit[1] if hit else None
    return record


def first_reached(row: Row, curve: list[list[float]]) -> list[float] | None:
    """The first point of a run's curve ([seconds, samples, metric]) that meets its target."""
    return next((point for point in curve if row.task.reached(point[2])), None)


def one_line(record: dict[str, Any]) -> str:
    if record["status"] != "ok":
        return f"failed: {record['error']}"
    ttt, figure = record["time_to_target"], record[record["target_metric"]]
    return (
        f"{'null' if figure is None else f'{figure:.4f}'} {record['target_metric']}, "
        f"{record['samples_per_second']:,.0f} samples/s, "
        f"target {'not reached' if ttt is None else f'in {ttt:.1f}s'}, "
        f"{record['wall_seconds']:.1f}s wall"
    )
