"""spark_engine: the same training run on the local engine and on the Spark engine (local[2]).

Each repeat runs, back to back and in alternating order:
- **local**: `ember train --epochs E` as a command (MNIST, mlp, easgd-async, 2 workers);
  its wall time.
- **spark (fresh session)**: `ember train --engine spark --master local[2] --epochs E`; its wall
  time less the SparkSession start the summary records (`spark.session_seconds`).
- **spark (running session)**: a child process that starts a SparkSession, then calls
  `ember.fit(engine="spark")` twice; the second call's time. This is what a Spark application
  pays whose session has run Python tasks before (Spark keeps its Python workers).

Both commands pay for their own interpreter start and imports. The ratios are computed per
repeat and summarized as median (min–max).

The Spark command starts its JVM from ember's class-data archive, as every run after a
machine's first does. When there is none yet, one Spark run before the repeats leaves it to be
written; its time, and when the archive was in place, are reported and not in the ratios.

--quick runs one repeat of 1 epoch with the archive switched off (unless EMBER_SPARK_CLASS_ARCHIVE
is set), so it neither waits for an archive to be written nor leaves a writer running.

Usage: python lab/benchmarks/spark_engine.py [--epochs E] [--repeat R] [--quick] [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import (
    fit_twice_in_session,
    fmt,
    make_parser,
    markdown_table,
    positive_int,
    report,
    spread,
)

EPOCHS = 3
ARCHIVE_SWITCH = "EMBER_SPARK_CLASS_ARCHIVE"  # "off": the JVMs start without the archive
MASTER = "local[2]"
TARGET = 1.3  # spark / local wall time, SparkSession start excluded: at most this
COMMAND_TIMEOUT = 600.0


def run_command(epochs: int, out: Path, *flags: str) -> dict[str, Any]:
    """`ember train` as a user runs it; its wall time and its summary."""
    command = [sys.executable, "-m", "ember", "train", "--epochs", str(epochs), "--out", str(out)]
    started = time.perf_counter()
    subprocess.run(
        [*command, *flags],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=COMMAND_TIMEOUT,
    )
    wall = time.perf_counter() - started
    summary = json.loads((out / "summary.json").read_text())
    return {"wall": wall, "started": started, "summary": summary}


def write_class_archive(epochs: int, root: Path) -> dict[str, float] | None:
    """The first Spark run on this machine, when there is no class-data archive: it lists its
    JVM's classes, and a detached writer makes the archive of them after it. None when the
    archive is there (or switched off)."""
    from ember.probe import class_archive

    archive = class_archive()
    if archive is None or archive.path.exists():
        return None
    first = run_command(epochs, root, "--engine", "spark", "--master", MASTER)
    deadline = time.monotonic() + COMMAND_TIMEOUT
    while not archive.path.exists():
        if time.monotonic() > deadline or archive.failed.exists():
            raise RuntimeError(f"no class-data archive was written to {archive.path}")
        time.sleep(0.2)
    done = time.perf_counter() - first["started"]
    return {"first_run_seconds": first["wall"], "archive_written_after_seconds": done}


def fit_twice_in_one_session(epochs: int, root: Path) -> list[float]:
    """In a child process: one SparkSession, two `ember.fit(engine="spark")` calls."""
    command = [sys.executable, __file__, "--fit-twice", str(root), "--epochs", str(epochs)]
    done = subprocess.run(command, capture_output=True, timeout=COMMAND_TIMEOUT)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr.decode()[-3000:]}")
    return [float(s) for s in done.stdout.decode().split()[-2:]]


def _fit_twice(epochs: int, root: Path) -> None:
    """The child's side: print the seconds of each call."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    print(*fit_twice_in_session(MASTER, root, epochs)["seconds"])


def one_repeat(index: int, epochs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ember-bench-spark-") as tmp:
        root = Path(tmp)
        runs = {
            "local": lambda: run_command(epochs, root / "local"),
            "spark": lambda: run_command(
                epochs, root / "spark", "--engine", "spark", "--master", MASTER
            ),
            "running": lambda: fit_twice_in_one_session(epochs, root),
        }
        order = ["local", "spark", "running"]
        order = order[index % 3 :] + order[: index % 3]
        done = {name: runs[name]() for name in order}
    local, spark = done["local"], done["spark"]
    session = spark["summary"]["spark"]["session_seconds"]
    return {
        "local_seconds": local["wall"],
        "spark_seconds": spark["wall"] - session,
        "session_seconds": session,
        "spark_whole_seconds": spark["wall"],
        "spark_prepare_seconds": spark["summary"]["spark"]["prepare_seconds"],
        "spark_job_seconds": spark["summary"]["spark"]["job_seconds"],
        "running_first_seconds": done["running"][0],
        "running_second_seconds": done["running"][1],
        "local_accuracy": local["summary"]["test_accuracy"],
        "spark_accuracy": spark["summary"]["test_accuracy"],
        "ratio": (spark["wall"] - session) / local["wall"],
    }


def summarize(repeats: list[dict[str, Any]]) -> dict[str, Any]:
    keys = [key for key in repeats[0] if key != "ratio"]
    results: dict[str, Any] = {key: spread([r[key] for r in repeats]) for key in keys}
    results["ratio"] = spread([r["ratio"] for r in repeats])
    results["whole_ratio"] = spread(
        [r["spark_whole_seconds"] / r["local_seconds"] for r in repeats]
    )
    results["running_ratio"] = spread(
        [r["running_second_seconds"] / r["local_seconds"] for r in repeats]
    )
    results["repeats"] = repeats
    return results


def at_most(ratio: dict[str, Any]) -> str:
    return "yes" if ratio["median"] <= TARGET else "**no**"


def table(results: dict[str, Any]) -> str:
    seconds = lambda key: fmt(results[key], 2)  # noqa: E731
    rows = [
        ["local engine: `ember train`", seconds("local_seconds"), "1", ""],
        [
            f"Spark {MASTER}, fresh session: `ember train --engine spark` less session start"
            f" ({seconds('session_seconds')} s); prepare"
            f" {seconds('spark_prepare_seconds')} s, job {seconds('spark_job_seconds')} s",
            seconds("spark_seconds"),
            fmt(results["ratio"], 2),
            at_most(results["ratio"]),
        ],
        [
            f"Spark {MASTER}, fresh session, the whole command (session start included; the"
            " driver loads the data and starts the servers while the JVM starts)",
            seconds("spark_whole_seconds"),
            fmt(results["whole_ratio"], 2),
            "",
        ],
        [
            f'Spark {MASTER}, running session: second `ember.fit(engine="spark")`',
            seconds("running_second_seconds"),
            fmt(results["running_ratio"], 2),
            at_most(results["running_ratio"]),
        ],
        [
            "test accuracy: local / Spark",
            f"{fmt(results['local_accuracy'], 4)} / {fmt(results['spark_accuracy'], 4)}",
            "",
            "",
        ],
    ]
    return markdown_table(["run", "seconds", "ratio to local", f"<= {TARGET}"], rows)


def main() -> None:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--epochs", type=positive_int, default=EPOCHS, help=f"epochs per run (default {EPOCHS})"
    )
    parser.add_argument("--fit-twice", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fit_twice:
        _fit_twice(args.epochs, args.fit_twice)
        return
    epochs, repeat = (1, 1) if args.quick else (args.epochs, args.repeat)
    if args.quick:  # no first run to write the archive, and no writer left running after
        os.environ.setdefault(ARCHIVE_SWITCH, "off")
    with tempfile.TemporaryDirectory(prefix="ember-bench-spark-") as tmp:
        first = write_class_archive(epochs, Path(tmp))
    if first is not None:
        print(
            f"first Spark run: {first['first_run_seconds']:.2f} s; the class-data archive was in"
            f" place {first['archive_written_after_seconds']:.2f} s after it started",
            flush=True,
        )
    repeats = []
    for index in range(repeat):
        repeats.append(one_repeat(index, epochs))
        done = repeats[-1]
        print(
            f"repeat {index + 1}/{repeat}: local {done['local_seconds']:.2f} s, Spark"
            f" {done['spark_seconds']:.2f} s (+{done['session_seconds']:.2f} s session), running"
            f" session {done['running_second_seconds']:.2f} s",
            flush=True,
        )
    print()
    settings = {"data": "mnist", "model": "mlp", "strategy": "easgd-async", "workers": 2}
    settings |= {"epochs": epochs, "master": MASTER, "repeat": repeat, "target": TARGET}
    results = summarize(repeats)
    results["class_archive"] = first or "present before the run"
    report("spark_engine", table(results), settings, results, args.out)


if __name__ == "__main__":
    main()
