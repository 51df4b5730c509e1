"""streaming: `ember train --data-mode stream` against the same run held in memory.

2 workers, easgd-async, one PyTorch thread each, on each of `--engines` (default: the local
engine and Spark `local[2]`, where each task spills its partition and streams from the spill):

- **big**: a synthetic-lr Parquet set of `--size` (default 4GB; 256 float32 features, 16 MB
  row groups, `ember data generate`) streamed for one epoch with logreg: each worker's peak
  resident set (VmHWM, which each worker reports in summary.json's data_per_worker), the PSS
  summed over the run's processes (sampled every 0.5 s) and samples/s.
- **subset**: a `--subset` set (default 1GB) of the same kind, `--subset-epochs` (default 3)
  streamed and in memory, back to back in rotating order, `--repeat` times: samples/s
  streamed over in memory, with logreg (a row costs less to train than to decode from
  Parquet: the data path's worst case) and with mlp (256-256-256-2 on these rows).
- **read paths**: one process reads the subset's training rows as a worker's read-ahead thread
  does, from its Parquet row groups, and from a Spark task's spill of the same rows (Arrow IPC,
  written once from record batches of 10,000 rows as Spark hands them): microseconds a row for
  each, and for writing the spill. What chose the spill on Spark.
- **mnist** (local engine): the vendored MNIST written as Parquet, mlp, `--mnist-epochs`
  epochs (default 3) streamed with the default shuffle buffer and in memory: test accuracy of
  each, in points.

Targets: peak RSS below 600 MB per worker; samples/s streamed >= 0.9 x in memory; accuracy
within 0.3 points. --quick: a 40MB big set, 20MB subset, mnist-like of 8MB for 1 epoch, one
repeat. The data sets are written under --keep DIR (and reused there), else in a temporary
folder removed at the end.

Usage: python lab/benchmarks/streaming.py [--size 4GB] [--subset 1GB] [--subset-epochs E]
       [--mnist-epochs E] [--engines local,spark] [--keep DIR] [--repeat R] [--quick] [--out F.json]
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from common import fmt, make_parser, markdown_table, report, spread
from ember.probe import generate, parse_size

TIMEOUT = 3600.0  # seconds one run may take
RSS_TARGET, SPEED_TARGET, ACCURACY_POINTS = 600 << 20, 0.9, 0.3
MODELS = ("logreg", "mlp")  # data-bound (a row costs less to train than to read), compute-bound
FLAGS = ["--workers", "2", "--strategy", "easgd-async", "--threads", "1", "--seed", "0"]
ENGINES = {"local": [], "spark": ["--engine", "spark", "--master", "local[2]"]}


def dataset(root: Path, name: str, kind: str, size: int) -> Path:
    """`kind` of `size` bytes under root/name, written once and reused."""
    out = root / name
    if not (out / "test.parquet").is_file():
        shutil.rmtree(out, ignore_errors=True)
        began = time.perf_counter()
        written = generate(kind, size, out, features=256)
        print(f"wrote {out}: {written.train_rows:,} rows in {time.perf_counter() - began:.0f} s")
    return out


def train(data: Path, mode: str, out: Path, *flags: str) -> dict[str, Any]:
    """One `ember train` run; its summary with the PSS summed over its processes, at most."""
    command = [sys.executable, "-m", "ember", "train", "--data", str(data), "--data-mode", mode]
    launcher = subprocess.Popen(
        [*command, *FLAGS, *flags, "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    peak_pss, deadline = 0, time.monotonic() + TIMEOUT
    while launcher.poll() is None:
        if time.monotonic() > deadline:
            launcher.kill()
            raise RuntimeError(f"{command} ran past {TIMEOUT:g} s")
        peak_pss = max(peak_pss, _pss([launcher.pid]))
        time.sleep(0.5)
    err = launcher.stderr.read() if launcher.stderr else ""
    if launcher.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{err}")
    summary = json.loads((out / "summary.json").read_text())
    shutil.rmtree(out, ignore_errors=True)
    return {**summary, "peak_pss_bytes": peak_pss}


def _pss(pids: list[int]) -> int:
    """PSS summed over the processes and all their descendants (each page counted once)."""
    total = 0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            for process in [root, *root.children(recursive=True)]:
                total += process.memory_full_info().pss
        except psutil.Error:
            continue  # a process that ended between the listing and the reading
    return total


def worker_rss(summary: dict[str, Any]) -> list[int]:
    return [w["peak_rss_bytes"] for w in summary["data_per_worker"].values()]


def main() -> None:
    parser = make_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="4GB", help="the big set's bytes of training rows")
    parser.add_argument("--subset", default="1GB", help="the set run streamed and in memory")
    parser.add_argument("--mnist-epochs", type=int, default=3)
    parser.add_argument("--subset-epochs", type=int, default=3, help="epochs of the subset's runs")
    parser.add_argument("--keep", type=Path, default=None, help="write (and reuse) data here")
    parser.add_argument("--engines", default="local,spark", help="local, spark or both")
    args = parser.parse_args()
    args.engines = [e for e in args.engines.split(",") if e]
    if unknown := set(args.engines) - set(ENGINES):
        parser.error(f"--engines: no engine {sorted(unknown)}; choose from {sorted(ENGINES)}")
    if args.quick:
        args.size, args.subset, args.mnist_epochs, args.repeat = "40MB", "20MB", 1, 1
        args.subset_epochs = 1
    root = args.keep or Path(tempfile.mkdtemp(prefix="ember-streaming-"))
    runs = Path(tempfile.mkdtemp(prefix="ember-streaming-runs-"))
    try:
        results = measure(args, root, runs)
    finally:
        shutil.rmtree(runs, ignore_errors=True)
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    mb = 1 << 20
    rows = []
    for engine in args.engines:
        big, found = results[engine]["big"], results[engine]
        rows += [
            [f"{engine}, big: peak RSS per worker (MB)",
             " / ".join(f"{b / mb:,.0f}" for b in big["rss"]),
             f"< {RSS_TARGET // mb}", "yes" if max(big["rss"]) < RSS_TARGET else "**no**"],
            [f"{engine}, big: PSS summed over the run (MB)", f"{big['pss'] / mb:,.0f}", "—", ""],
            [f"{engine}, big: samples/s streamed", f"{big['speed']:,.0f}", "—", ""],
        ]  # fmt: skip
        for model in MODELS:
            ratio = spread(found["speed_ratio"][model])
            rows += [
                [f"{engine}, subset, {model}: samples/s streamed / in memory", fmt(ratio),
                 f">= {SPEED_TARGET}", "yes" if ratio["median"] >= SPEED_TARGET else "**no**"],
                [f"{engine}, subset, {model}: samples/s in memory",
                 fmt(spread(found["memory_speed"][model]), 0), "—", ""],
            ]  # fmt: skip
    paths = results["read_paths"]
    rows.append(
        ["read paths (µs a row): Parquet row groups / spill written (with its decode) / spill read",
         "{parquet_read:.2f} / {spill_write:.2f} / {spill_read:.2f}".format(**paths), "—", ""]
    )  # fmt: skip
    if "accuracy" in results:
        streamed, held = results["accuracy"]
        met = round(abs(streamed - held) * 100, 6) <= ACCURACY_POINTS
        rows.append(
            ["local, mnist: accuracy streamed / in memory", f"{streamed:.4f} / {held:.4f}",
             f"within {ACCURACY_POINTS} points", "yes" if met else "**no**"]
        )  # fmt: skip
    table = markdown_table(["figure", "measured", "target", "met"], rows)
    settings = {k: str(v) for k, v in vars(args).items()}
    report("streaming", table, settings, results, args.out)


def measure(args: Any, root: Path, runs: Path) -> dict[str, Any]:
    subset = dataset(root, f"subset-{args.subset}", "synthetic-lr", parse_size(args.subset))
    big_data = dataset(root, f"big-{args.size}", "synthetic-lr", parse_size(args.size))
    results: dict[str, Any] = {
        engine: measure_engine(args, subset, big_data, runs, ENGINES[engine])
        for engine in args.engines
    }
    results["read_paths"] = read_paths(subset, runs)
    if "local" in args.engines:
        kind = "mnist-like" if args.quick else "mnist"
        mnist = dataset(root, kind, kind, parse_size("8MB"))
        flags = ("--model", "mlp", "--epochs", str(args.mnist_epochs))
        runs_of = {mode: train(mnist, mode, runs / mode, *flags) for mode in ("stream", "memory")}
        results["accuracy"] = [runs_of[mode]["test_accuracy"] for mode in ("stream", "memory")]
    return results


def read_paths(subset: Path, folder: Path) -> dict[str, float]:
    """Microseconds a row: reading the subset's row groups, spilling them, reading the spill."""
    import pyarrow.parquet as pq

    from ember.probe import StreamPlan, plan_files, read_piece, spill_batches

    plan = plan_files(subset / "train.parquet")
    began = time.perf_counter()
    for piece in plan.pieces:
        read_piece(piece, plan.input_shape)
    parquet = time.perf_counter() - began
    with pq.ParquetFile(subset / "train.parquet") as source:
        batches = source.iter_batches(batch_size=10_000, columns=["features", "label"])
        began = time.perf_counter()
        pieces = spill_batches(batches, folder / "spill.arrow")  # decoding included: a JVM's work
        write = time.perf_counter() - began
    spilled = StreamPlan(pieces, plan.input_shape, plan.num_classes)
    began = time.perf_counter()
    for piece in spilled.pieces:
        read_piece(piece, plan.input_shape)
    read = time.perf_counter() - began
    (folder / "spill.arrow").unlink()
    per = 1e6 / plan.rows
    return {"parquet_read": parquet * per, "spill_write": write * per, "spill_read": read * per}


def measure_engine(
    args: Any, subset: Path, big_data: Path, runs: Path, engine: list[str]
) -> dict[str, Any]:
    """One engine's figures: the subset streamed and in memory side by side, then the big set
    streamed."""
    logreg = [*engine, "--model", "logreg", "--batch-size", "256", "--lr", "0.05"]
    ratios: dict[str, list[float]] = {model: [] for model in MODELS}
    memory_speeds: dict[str, list[float]] = {model: [] for model in MODELS}
    for repeat in range(args.repeat):
        modes = ("stream", "memory") if repeat % 2 == 0 else ("memory", "stream")
        for model in MODELS:
            flags = ["--epochs", str(args.subset_epochs), *logreg, "--model", model]
            speed = {m: train(subset, m, runs / m, *flags)["samples_per_second"] for m in modes}
            ratios[model].append(speed["stream"] / speed["memory"])
            memory_speeds[model].append(speed["memory"])
    big = train(big_data, "stream", runs / "big", "--epochs", "1", *logreg)
    return {
        "big": {
            "rss": worker_rss(big),
            "pss": big["peak_pss_bytes"],
            "speed": big["samples_per_second"],
            "data_wait_seconds": big["data_wait_seconds"],
            "rows_read": big["rows_read"],
        },
        "speed_ratio": ratios,
        "memory_speed": memory_speeds,
    }


if __name__ == "__main__":
    main()
