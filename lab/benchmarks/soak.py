"""Soak: train while a random worker or primary server is SIGKILLed every few seconds.

Runs `ember train` (easgd-async on MNIST, 4 workers, 2 shards, each with a backup) as a child,
and every `--every` seconds kills one of its worker processes or the process currently serving
as a shard's primary (known from the `server` events the launcher writes to metrics.jsonl).
At the end it reads the run directory and reports: faults injected, restarts and failovers the
launcher made, worker steps redone (progress lost), the final test accuracy, and whether the run
ended on its own (no hang) with no process left behind.

    python lab/benchmarks/soak.py [--every 5] [--epochs 20] [--workers 4] [--servers 2] [--faults N]
                              [--out soak-run] [--seed 0] [--min-accuracy 0.97] [--report F.json]
                              [--quick]

--quick is a smoke test: 2 workers on 1 replicated shard for 2 epochs, a fault every 2 seconds and
at most 3 of them, in a temporary run directory; the run passes at test accuracy 0.9.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from ember.metrics.records import (
    Record,
    ServerEvent,
    WorkerProgress,
    WorkerRestart,
    WorkerStart,
)

PRIMARY_SLOTS = ("server-0.log", "server-1.log")  # slot 0 of each shard starts as primary


QUICK = {
    "every": 2.0,
    "epochs": 2,
    "faults": 3,
    "workers": 2,
    "servers": 1,
    "timeout": 300.0,
    "min_accuracy": 0.9,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=float, default=5.0, help="seconds between faults")
    parser.add_argument("--epochs", type=int, default=20, help="MNIST epochs to train")
    parser.add_argument("--workers", type=int, default=4, help="worker processes")
    parser.add_argument("--servers", type=int, default=2, help="server shards, each with a backup")
    parser.add_argument("--faults", type=int, default=None, help="stop injecting after this many")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="run directory (default soak-run; a temporary one with --quick)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds the choice of victims")
    parser.add_argument("--timeout", type=float, default=1200.0, help="a hang after this fails")
    parser.add_argument("--report", type=Path, default=None, help="also write the report JSON")
    parser.add_argument(
        "--min-accuracy", type=float, default=0.97, help="the test accuracy the run must reach"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke test: 2 workers, 1 shard, 2 epochs, a fault every 2 s, at most 3 faults",
    )
    args = parser.parse_args()
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    if args.out is not None:
        return soak(args, args.out)
    if not args.quick:
        return soak(args, Path("soak-run"))
    with tempfile.TemporaryDirectory(prefix="ember-soak-") as tmp:
        return soak(args, Path(tmp) / "soak-run")


def soak(args: argparse.Namespace, out: Path) -> int:
    """Train in `out` under faults; print the report; 0 if the run survived them."""
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "ember", "train",
        "--strategy", "easgd-async", "--replicas", "2",
        "--workers", str(args.workers), "--servers", str(args.servers),
        "--epochs", str(args.epochs), "--max-restarts", "1000", "--checkpoint-seconds", "5",
        "--log-every", "8",
        "--out", str(out),
    ]  # fmt: skip
    started = time.monotonic()
    console = out.with_name(out.name + "-console.log")
    with console.open("w") as sink:  # a file, not a pipe: nothing can block the launcher
        launcher = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, text=True)
        faults = inject_faults(
            launcher, out, args.every, random.Random(args.seed), args.timeout, args.faults
        )
        try:
            launcher.wait(timeout=max(1.0, args.timeout - (time.monotonic() - started)))
            hung = False
        except subprocess.TimeoutExpired:
            launcher.kill()
            launcher.wait()
            hung = True
    children_left = [p.pid for p in psutil.process_iter(["cmdline"]) if _belongs(p, out)]
    report = summarize(out, faults, launcher.returncode, hung, children_left, started)
    report["console_tail"] = console.read_text().strip().splitlines()[-3:]
    print(json.dumps(report, indent=2))
    if args.report is not None:
        args.report.write_text(json.dumps(report, indent=2) + "\n")
    ok = launcher.returncode == 0 and not hung and not children_left
    return 0 if ok and report["test_accuracy"] >= args.min_accuracy else 1


def inject_faults(
    launcher: subprocess.Popen[str],
    run: Path,
    every: float,
    rng: random.Random,
    timeout: float,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Kill a random worker or primary every `every` seconds until the launcher exits, or
    until `limit` faults (when given) have been injected."""
    faults: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    next_fault = time.monotonic() + every
    while launcher.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
        if limit is not None and len(faults) >= limit:
            break
        if time.monotonic() < next_fault or not _training(run):
            continue
        targets = victims(launcher.pid, run)
        if not targets:
            continue
        kind, name, process = rng.choice(targets)
        try:
            process.kill()
        except psutil.NoSuchProcess:
            continue
        faults.append({"at": round(time.monotonic(), 1), "kind": kind, "target": name})
        print(f"soak: killed {kind} {name} (pid {process.pid})", file=sys.stderr, flush=True)
        next_fault = time.monotonic() + every
    return faults


def victims(launcher_pid: int, run: Path) -> list[tuple[str, str, psutil.Process]]:
    """The launcher's live workers, and the processes serving as primaries right now."""
    primaries = set(PRIMARY_SLOTS)
    for record in _server_events(run):
        if record["event"] == "promoted":
            shard = record["server"].split("-")[2]
            primaries.discard(f"server-{shard}.log")
            primaries.discard(f"server-{shard}-replica-1.log")
            primaries.add(record["server"].removeprefix("ember-") + ".log")
    found = []
    try:
        children = psutil.Process(launcher_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    for process in children:
        log = _log_name(process)
        if log.startswith("worker-"):
            found.append(("worker", log.removesuffix(".log"), process))
        elif log in primaries:
            found.append(("primary server", log.removesuffix(".log"), process))
    return found


def summarize(
    run: Path,
    faults: list[dict[str, Any]],
    returncode: int | None,
    hung: bool,
    children_left: list[int],
    started: float,
) -> dict[str, Any]:
    records = _records(run)
    summary = (
        json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    )
    return {
        "returncode": returncode,
        "hung": hung,
        "processes_left": children_left,
        "wall_seconds": round(time.monotonic() - started, 1),
        "faults_injected": len(faults),
        "worker_kills": sum(f["kind"] == "worker" for f in faults),
        "primary_kills": sum(f["kind"] == "primary server" for f in faults),
        "worker_restarts": sum(isinstance(r, WorkerRestart) for r in records),
        "server_promotions": sum(r.get("event") == "promoted" for r in _server_events(run)),
        "server_restarts": sum(r.get("event") == "restarted" for r in _server_events(run)),
        "worker_steps_redone": steps_redone(records),
        "test_accuracy": summary.get("test_accuracy", 0.0),
        "train_seconds": summary.get("train_seconds"),
        "faults": faults,
    }


def steps_redone(records: list[Record]) -> int:
    """Progress lost: for each restarted worker, the steps its last incarnation had reported
    beyond the step its new incarnation resumed from (what the servers had recorded). Workers
    report every 8 steps, so up to 7 more per restart may go uncounted."""
    last_step: dict[int, int] = {}
    lost = 0
    for record in records:
        if isinstance(record, WorkerProgress):
            last_step[record.rank] = record.step
        elif isinstance(record, WorkerStart) and record.incarnation > 0:
            lost += max(0, last_step.get(record.rank, 0) - record.first_step)
    return lost


def _records(run: Path) -> list[Record]:
    """metrics.jsonl as written so far (the launcher may be mid-line)."""
    path, records = run / "metrics.jsonl", []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            records.append(Record.from_json(json.loads(line)))
        except ValueError:  # a line cut short (JSONDecodeError is one)
            continue
    return records


def _server_events(run: Path) -> list[Mapping[str, Any]]:
    return [r.details for r in _records(run) if isinstance(r, ServerEvent)]


def _training(run: Path) -> bool:
    return any(isinstance(r, WorkerProgress) for r in _records(run))


def _log_name(process: psutil.Process) -> str:
    try:
        return next(
            (Path(f.path).name for f in process.open_files() if f.path.endswith(".log")), ""
        )
    except psutil.Error:
        return ""


def _belongs(process: psutil.Process, run: Path) -> bool:
    """A process (other than this script) holding a file inside the run directory open."""
    inside = str(run.resolve()) + "/"
    try:
        return process.pid != os.getpid() and any(
            f.path.startswith(inside) for f in process.open_files()
        )
    except psutil.Error:
        return False


if __name__ == "__main__":
    raise SystemExit(main())
