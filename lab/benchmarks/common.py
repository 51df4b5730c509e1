"""Helpers shared by the benchmark scripts: CLI flags, child processes, statistics, output."""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ember.probe import positive_int

SPAWN = mp.get_context("spawn")  # as ember does: fork would copy torch's threads and locks
CHILD_TIMEOUT = 600.0  # seconds a benchmark child may take before it counts as hung


# ---- command line -------------------------------------------------------------------------------
def make_parser(description: str) -> argparse.ArgumentParser:
    """The flags every benchmark takes: --repeat, --quick and --out."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--repeat",
        type=positive_int,
        default=5,
        help="independent side-by-side repeats; figures are their median (default 5)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke test: smallest settings and one repeat"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="also write the figures to this JSON"
    )
    return parser


def add_run_flags(parser: argparse.ArgumentParser, epochs: int, each: str = "") -> None:
    """--epochs and --data, for the benchmarks that train (see `run_settings`)."""
    parser.add_argument(
        "--epochs",
        type=positive_int,
        default=epochs,
        help=f"epochs per run{each} (default {epochs}; 1 with --quick)",
    )
    parser.add_argument(
        "--data", default=None, help="dataset name (default mnist; digits with --quick)"
    )


def run_settings(args: argparse.Namespace) -> tuple[int, int, str]:
    """(epochs, repeats, data) of the flags: --quick's one epoch of digits, once."""
    epochs, repeat = (1, 1) if args.quick else (args.epochs, args.repeat)
    return epochs, repeat, args.data or ("digits" if args.quick else "mnist")


def ember_train(flags: Sequence[str], source: Path, seconds: float) -> dict[str, Any]:
    """summary.json of one `ember train` process with `flags`, ember imported from `source`
    (a checkout's src/); RuntimeError with its error output when it fails."""
    with tempfile.TemporaryDirectory(prefix="ember-bench-") as tmp:
        out = Path(tmp) / "run"
        command = [sys.executable, "-m", "ember", "train", "--out", str(out), *flags]
        env = {**os.environ, "PYTHONPATH": str(source)}
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=seconds, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
        summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return summary


def set_threads() -> None:
    """One PyTorch thread per process: the benchmarks share two cores."""
    import torch

    torch.set_num_threads(1)


# ---- child processes ----------------------------------------------------------------------------
def start(target: Callable[..., Any], *args: Any) -> Any:
    """Spawn `target(*args)` in a child process; the caller joins it (see `finish`)."""
    process = SPAWN.Process(target=target, args=args, daemon=True)
    process.start()
    return process


def finish(processes: Sequence[Any], timeout: float = 30.0) -> None:
    """Join children, killing any that outlive `timeout` seconds."""
    for process in processes:
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join(5.0)


def call_in_child(target: Callable[..., Any], *args: Any) -> Any:
    """Run `target(*args)` in a spawned process and return its (picklable) result."""
    return call_in_children([(target, args)])[0]


def call_in_children(calls: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]]) -> list[Any]:
    """Start every `target(*args)` at once in its own spawned process; return their results."""
    started = []
    for target, args in calls:
        receiver, sender = SPAWN.Pipe(duplex=False)
        started.append((start(_send_result, sender, target, args), receiver))
        sender.close()
    try:
        return [_receive(process, receiver) for process, receiver in started]
    finally:
        finish([process for process, _ in started])


def _send_result(sender: Any, target: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        sender.send(("ok", target(*args)))
    except BaseException:
        sender.send(("error", traceback.format_exc()))
        raise


def _receive(process: Any, receiver: Any) -> Any:
    if not receiver.poll(CHILD_TIMEOUT):
        raise RuntimeError(f"benchmark child {process.name} sent nothing in {CHILD_TIMEOUT:g}s")
    try:
        status, value = receiver.recv()
    except EOFError:
        process.join(5.0)
        raise RuntimeError(
            f"benchmark child {process.name} died (exit code "
            f"{process.exitcode}) before sending a result"
        ) from None
    if status != "ok":
        raise RuntimeError(f"benchmark child {process.name} failed:\n{value}")
    return value


# ---- side by side -------------------------------------------------------------------------------
def side_by_side(
    index: int, ember: Callable[[], dict[str, Any]], plain: Callable[[], dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """An ember run and a plain run back to back; odd repeats start with the plain one. Both
    must have trained the same samples, or the figures compare nothing."""
    runs = {"ember": ember, "plain": plain}
    order = ["ember", "plain"] if index % 2 == 0 else ["plain", "ember"]
    figures = {name: runs[name]() for name in order}
    if figures["ember"]["samples"] != figures["plain"]["samples"]:
        raise RuntimeError(
            f"ember trained {figures['ember']['samples']} samples, the plain loop "
            f"{figures['plain']['samples']}: the runs are not comparable"
        )
    return figures


def summarize_pair(repeats: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Each side's samples/s and test accuracy over the repeats, and ember / plain."""
    results: dict[str, Any] = {
        name: {
            key: spread([r[name][key] for r in repeats])
            for key in ("samples_per_second", "test_accuracy")
        }
        for name in ("ember", "plain")
    }
    ratios = [r["ember"]["samples_per_second"] / r["plain"]["samples_per_second"] for r in repeats]
    results["ratio"] = spread(ratios)
    results["repeats"] = repeats
    return results


def pair_table(results: dict[str, Any], ember_label: str, target: float) -> str:
    ember, plain, ratio = results["ember"], results["plain"], results["ratio"]
    rows = [
        [
            "samples/s",
            fmt(ember["samples_per_second"], 0),
            fmt(plain["samples_per_second"], 0),
            fmt(ratio, 3),
            check(ratio, target),
        ],
        ["test accuracy", fmt(ember["test_accuracy"], 4), fmt(plain["test_accuracy"], 4), "", ""],
    ]
    headers = ["figure", ember_label, "plain PyTorch", "ember / plain", f">= {target}"]
    return markdown_table(headers, rows)


def repeat_side_by_side(
    repeat: int, ember: Callable[[], dict[str, Any]], plain: Callable[[], dict[str, Any]]
) -> list[dict[str, dict[str, Any]]]:
    """`repeat` side-by-side repeats, each said as it ends."""
    repeats = []
    for index in range(repeat):
        done = side_by_side(index, ember, plain)
        repeats.append(done)
        print(
            f"repeat {index + 1}/{repeat}: ember {done['ember']['samples_per_second']:,.0f}, "
            f"plain {done['plain']['samples_per_second']:,.0f} samples/s",
            flush=True,
        )
    print()
    return repeats


# ---- statistics and output ----------------------------------------------------------------------
def spread(values: Sequence[float]) -> dict[str, Any]:
    """Median, min and max of one figure over the repeats, plus the values themselves."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "runs": list(values),
    }


def fmt(stat: dict[str, Any], digits: int = 2) -> str:
    """`median (min–max)`, or just the value when there was one repeat."""
    if stat["min"] == stat["max"]:
        return f"{stat['median']:,.{digits}f}"
    return f"{stat['median']:,.{digits}f} ({stat['min']:,.{digits}f}–{stat['max']:,.{digits}f})"


def check(stat: dict[str, Any], target: float) -> str:
    """Whether the median meets a `>= target` goal."""
    return "yes" if stat["median"] >= target else "**no**"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def environment() -> dict[str, Any]:
    """What the figures depend on besides the code: versions and the machine."""
    import numpy
    import torch
    import zmq

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "pyzmq": zmq.__version__,
        "zmq": zmq.zmq_version(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "load_average": list(os.getloadavg()),
    }


def fit_twice_in_session(master: str, root: Path, epochs: int) -> dict[str, list[float]]:
    """One SparkSession on `master`, then two `ember.fit(engine="spark")` calls of the default
    job (MNIST, easgd-async, 2 workers): each call's seconds and test accuracy. The second is
    what an application or notebook with a running session pays."""
    import time

    from pyspark.sql import SparkSession

    import ember
    from ember.probe import end_spark

    # Two runs' data in the JVM at once: more than Spark's 1g default heap holds
    spark = SparkSession.builder.master(master).config("spark.driver.memory", "4g").getOrCreate()
    spark.sparkContext.setLogLevel("FATAL")
    seconds, test_accuracy = [], []
    try:
        for run in range(2):
            started = time.perf_counter()
            result = ember.fit(engine="spark", epochs=epochs, out=str(root / f"fit{run}"))
            seconds.append(time.perf_counter() - started)
            test_accuracy.append(result.summary["test_accuracy"])
    finally:
        end_spark(spark)
    return {"seconds": seconds, "test_accuracy": test_accuracy}


def report(name: str, table: str, settings: dict[str, Any], results: Any, out: Path | None) -> None:
    """Print the Markdown table and, with --out, write everything to JSON."""
    print(table)
    if out is None:
        return
    data = {
        "benchmark": name,
        "settings": settings,
        "environment": environment(),
        "results": results,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")
    print(f"\nwrote {out}")
