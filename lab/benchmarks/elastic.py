"""elastic: what joins, leaves and faults cost a worker range's run, easgd-async beside async.

Three figures, each on ember's mlp for every strategy, through `ember train`, `ember join`,
`ember leave` and SIGKILL alone (runs read back from metrics.jsonl and summary.json):

1. stall per membership change: a `--workers 2:4` run with `--log-every 5` takes one `ember
   join`; once the join is counted, worker 0 is SIGKILLed (the engine restarts it); once it is
   back, `ember leave --worker 1`. For each change, the stall is the longest gap between
   consecutive progress records of a rank that stayed in, within `--window` seconds of the
   change, less that rank's median gap over the run (never below 0; elastic_figures.py).
   Target: at most 1 s.
2. throughput against the member count: samples/s of `--workers N:4` runs whose membership
   never changes, and of the fixed `--workers N` run beside each (alternating which goes
   first), N = 1..4; the range should be no slower than the fixed run.
3. time to finish under faults: a `--workers 2:3` run sized to last `--fault-seconds` without
   faults (from figure 2's samples/s at 2 members), once clean and once with a worker SIGKILLed
   every `--every` seconds (at most `--faults`, ranks in turn, each restarted): the wall time
   ratio (target at most 1.2x), the accuracy of both, rows_trained_twice and pieces_reissued.

Figures are medians (min-max) of `--repeat` runs. Runs go to a temporary directory unless
`--out DIR` is given; every process started is killed and reaped at the end, on error too.

    python lab/benchmarks/elastic.py [--repeat 3] [--epochs 1] [--stall-seconds 50]
                                     [--fault-seconds 80] [--every 15] [--faults 6] [--window 3]
                                     [--out DIR] [--report F.json] [--quick]

--quick is a smoke test: `digits`, 2 epochs, small batches so the runs last long enough for one
change of each kind, N in {1, 2}, a fault run with one fault; one repeat; docs/ is left alone.
The full mode writes docs/elastic.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from common import environment
from elastic_figures import (
    change_times,
    fault_table,
    read_records,
    stall,
    stall_table,
    throughput_table,
)

STRATEGIES = ("easgd-async", "async")
QUICK_BATCH = {"easgd-async": 4, "async": 8}  # a --quick stall run lasts long enough to change
STALL_TARGET, FAULT_TARGET = 1.0, 1.2
DOC = Path(__file__).resolve().parents[2] / "docs" / "elastic.md"
ROWS = {"mnist": 60_000, "digits": 10_000}  # training rows an epoch
BEGAN = time.monotonic()
STARTED: list[subprocess.Popen[bytes]] = []  # every process this script started, for cleanup


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (default 3)")
    parser.add_argument("--epochs", type=int, default=1, help="epochs of a throughput run")
    parser.add_argument("--stall-seconds", type=float, default=50.0, help="a stall run's length")
    parser.add_argument("--fault-seconds", type=float, default=80.0, help="a clean fault run's")
    parser.add_argument("--every", type=float, default=15.0, help="seconds between faults")
    parser.add_argument("--faults", type=int, default=6, help="faults at most, a run")
    parser.add_argument("--window", type=float, default=3.0, help="seconds each side of a change")
    parser.add_argument("--out", type=Path, default=None, help="keep the runs in this directory")
    parser.add_argument("--report", type=Path, default=None, help="also write the figures JSON")
    parser.add_argument("--quick", action="store_true", help="a smoke test, under a minute")
    args = parser.parse_args()
    data, counts = ("digits", (2,)) if args.quick else ("mnist", (1, 2, 3, 4))
    if args.quick:
        args.repeat, args.epochs, args.every, args.faults, args.window = 1, 1, 0.5, 1, 1.0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally below still runs
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="ember-elastic-") as tmp:
            root = args.out or Path(tmp)
            root.mkdir(parents=True, exist_ok=True)
            results = measure(args, root, data, counts)
    finally:
        for process in STARTED:
            end(process)
    results["seconds"] = round(time.monotonic() - started, 1)
    page = render(args, data, results)
    print(page)
    if args.report is not None:
        args.report.write_text(json.dumps(results, indent=2) + "\n")
    if not args.quick:
        DOC.write_text(page)
        print(f"wrote {DOC}")
    return 0


def measure(args: argparse.Namespace, root: Path, data: str, counts: tuple[int, ...]) -> Any:
    base = ["--data", data, "--log-every", "5", "--seed", "0"]
    strategies = STRATEGIES[:1] if args.quick else STRATEGIES  # a smoke test: one of them
    throughput: dict[str, dict[int, list[Any]]] = {s: {} for s in strategies}
    for index in range(args.repeat):
        for count in counts:
            for strategy in strategies:
                flags = [*base, "--strategy", strategy, "--epochs", str(args.epochs)]
                pair = {}
                for kind in ("range", "fixed") if index % 2 == 0 else ("fixed", "range"):
                    workers = f"{count}:4" if kind == "range" else str(count)
                    run = root / f"throughput-{strategy}-{count}-{kind}-{index}"
                    pair[kind] = Run(run, [*flags, "--workers", workers]).finish(600.0)
                throughput[strategy].setdefault(count, []).append(pair)
                say(f"throughput {strategy} {count}: {_rates(pair)}")
    stalls: dict[str, list[Any]] = {s: [] for s in strategies}
    faults: dict[str, list[Any]] = {s: [] for s in strategies}
    for index in range(args.repeat):
        for strategy in strategies:
            rate = min(r["range"]["samples_per_second"] for r in throughput[strategy][2])
            epochs = 2 if args.quick else _epochs(args.stall_seconds, rate, data)
            quick = ["--batch-size", str(QUICK_BATCH[strategy])] if args.quick else []
            flags = [*base, *quick, "--strategy", strategy, "--epochs", str(epochs)]
            run = root / f"stall-{strategy}-{index}"
            stalls[strategy].append(stall_run(run, [*flags, "--workers", "2:4"], args))
            say(f"stalls {strategy}: {_stalls(stalls[strategy][-1])}")
        for strategy in strategies:
            rate = min(r["range"]["samples_per_second"] for r in throughput[strategy][2])
            epochs = 2 if args.quick else _epochs(args.fault_seconds, rate, data)
            batch = ["--batch-size", "16"] if args.quick else []
            flags = [*base, *batch, "--strategy", strategy, "--epochs", str(epochs)]
            flags += ["--workers", "2:3", "--max-restarts", str(args.faults + 3)]
            pair = {}
            for kind in ("clean", "faulted") if index % 2 == 0 else ("faulted", "clean"):
                every = args.every if kind == "faulted" else math.inf
                pair[kind] = fault_run(
                    root / f"fault-{strategy}-{kind}-{index}", flags, every, args
                )
                pair[kind]["epochs"] = epochs
            faults[strategy].append(pair)
            say(f"faults {strategy}: {_walls(pair)}")
    return {"throughput": throughput, "stalls": stalls, "faults": faults, "data": data}


class Run:
    """One `ember train` launcher in its own session, its console in a file."""

    def __init__(self, out: Path, flags: list[str]) -> None:
        shutil.rmtree(out, ignore_errors=True)  # a run directory of an earlier invocation
        self.out, self.started = out, time.monotonic()
        command = [sys.executable, "-m", "ember", "train", "--out", str(out), *flags]
        self.command = " ".join(command[1:])
        self.console = out.with_name(out.name + "-console.log")
        self.process = spawn(command, self.console)

    def records(self) -> list[dict[str, Any]]:
        return read_records(self.out)

    def wait_for(self, found: Callable[[list[dict[str, Any]]], bool], seconds: float) -> bool:
        """Whether `found(records)` came true before `seconds` passed or the run ended."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and self.process.poll() is None:
            if found(self.records()):
                return True
            time.sleep(0.1)
        return found(self.records())

    def worker_pid(self, rank: int) -> int | None:
        try:
            pid = json.loads((self.out / "members.json").read_text())["pids"].get(str(rank))
        except (OSError, ValueError, KeyError):
            return None
        return pid if isinstance(pid, int) else None

    def kill_worker(self, rank: int) -> bool:
        pid = self.worker_pid(rank)
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return False
        for child in children:  # members.json's pid, checked to be this launcher's child
            if child.pid == pid:
                child.kill()
                return True
        return False

    def finish(self, seconds: float) -> dict[str, Any]:
        """summary.json once the launcher exits, with this script's wall time of the run."""
        try:
            self.process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            end(self.process)
            raise RuntimeError(f"{self.command} still running after {seconds:g} s") from None
        wall = time.monotonic() - self.started
        if self.process.returncode != 0:
            tail = self.console.read_text()[-2000:]
            raise RuntimeError(f"{self.command} exited {self.process.returncode}:\n{tail}")
        summary: dict[str, Any] = json.loads((self.out / "summary.json").read_text())
        return {**summary, "launch_to_exit_seconds": round(wall, 2)}


def stall_run(out: Path, flags: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """A 2:4 run that takes a join, then loses worker 0 to SIGKILL, then lets worker 1 leave."""
    run, pause = Run(out, flags), 0.5 if args.quick else args.window + 2.0
    ember = [sys.executable, "-m", "ember"]
    outcome: dict[str, Any] = {"steps": [], "join_exit_code": None}
    joiner = None
    if args.quick:  # the joiner's start overlaps the run's: a short run still sees it join
        ready = run.wait_for(lambda _: (out / "join.json").exists(), 120.0)
    else:
        ready = run.wait_for(lambda rs: any(r["kind"] == "worker" for r in rs), 120.0)
        time.sleep(args.window)
    if ready:
        joiner = spawn([*ember, "join", str(out)], out.with_name(out.name + "-join.log"))
        joined = run.wait_for(lambda rs: bool(change_times(rs, 0, 1).get("join")), 60.0)
        outcome["steps"].append(f"join counted: {joined}")
        time.sleep(pause)
        killed = run.kill_worker(0) and run.wait_for(
            lambda rs: "kill" in change_times(rs, 0, 1), 30.0
        )
        outcome["steps"].append(f"worker 0 killed and restarted: {killed}")
        time.sleep(pause)
        left = subprocess.run(
            [*ember, "leave", str(out), "--worker", "1"], capture_output=True, timeout=30
        )
        outcome["steps"].append(f"leave exit code: {left.returncode}")
    summary = run.finish(600.0)
    if joiner is not None:
        try:
            outcome["join_exit_code"] = joiner.wait(timeout=60.0)
        except subprocess.TimeoutExpired:
            end(joiner)
    records = run.records()
    changed = {"join": None, "kill": 0, "leave": 1}
    for change, at in change_times(records, killed=0, left=1).items():
        outcome[change] = stall(records, at, changed[change], args.window)
    outcome.update({k: summary.get(k) for k in ("joins", "leaves", "test_accuracy")})
    return outcome


def fault_run(out: Path, flags: list[str], every: float, args: argparse.Namespace) -> Any:
    """A run with a worker SIGKILLed every `every` seconds of training (ranks in turn), at
    most `args.faults` times; its wall time (launch to exit) and what it redid."""
    run, injected = Run(out, flags), 0
    run.wait_for(lambda rs: any(r["kind"] == "worker" for r in rs), 120.0)
    next_fault = time.monotonic() + every
    deadline = time.monotonic() + 1200.0
    while run.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
        if injected < args.faults and time.monotonic() >= next_fault:
            injected += run.kill_worker(injected % 2)
            next_fault = time.monotonic() + every
    summary = run.finish(max(1.0, deadline - time.monotonic()))
    keys = ("test_accuracy", "rows_trained_twice", "pieces_reissued", "worker_restarts")
    return {
        "wall_seconds": summary["launch_to_exit_seconds"],
        "train_seconds": summary.get("train_seconds"),
        "faults": injected,
        **{k: summary.get(k) for k in keys},
    }


def spawn(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    """`command` in a session of its own, output to `log`, remembered for the cleanup."""
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    STARTED.append(process)
    return process


def end(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to a started process and its descendants, SIGKILL to what is left after 10 s;
    every one reaped."""
    if process.poll() is not None:
        return
    try:
        family = [psutil.Process(process.pid), *psutil.Process(process.pid).children(True)]
    except psutil.NoSuchProcess:
        family = []
    for member in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(family, timeout=10.0)
    for member in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    psutil.wait_procs(alive, timeout=5.0)
    process.wait()


def render(args: argparse.Namespace, data: str, results: dict[str, Any]) -> str:
    command = "python lab/benchmarks/elastic.py" + (" --quick" if args.quick else "")
    env = environment()
    return "\n".join(
        [
            "# Elastic training: joins, leaves and faults",
            "",
            f"`{command}` ({results['seconds'] / 60:.0f} minutes) on a {env['cpus']}-core"
            f" machine, Python {env['python']}, torch {env['torch']}: the mlp on `{data}`,"
            f" easgd-async and async, through `ember train`, `ember join`, `ember leave` and"
            f" SIGKILL. Each figure is the median (min–max) of {args.repeat} runs; the script's"
            " docstring says how each is measured.",
            "",
            "## Stall per membership change (`--workers 2:4`, `--log-every 5`)",
            "",
            "One run takes a join, then loses worker 0 to SIGKILL (restarted), then lets worker"
            " 1 leave. A change's stall: the longest gap between consecutive progress records"
            f" of a rank that stayed in, within {args.window:g} s of the change, less that"
            " rank's median gap over the run.",
            "",
            stall_table(results["stalls"], STALL_TARGET),
            "",
            "## Throughput against the member count",
            "",
            f"{args.epochs} epoch(s) a run, a range `--workers N:4` that nobody joins or leaves"
            " beside the fixed `--workers N`, alternating which goes first.",
            "",
            throughput_table(results["throughput"]),
            "",
            f"## Time to finish with a fault every {args.every:g} s (`--workers 2:3`)",
            "",
            "Wall time from launch to exit, the same run without faults and with a worker"
            f" SIGKILLed every {args.every:g} s of training (at most {args.faults}, ranks 0 and"
            " 1 in turn, each restarted); its epochs sized from the 2-member range's samples/s"
            f" to last about {args.fault_seconds:g} s without faults.",
            "",
            fault_table(results["faults"], FAULT_TARGET),
            "",
            "## Caveats",
            "",
            f"- A range that nobody joins or leaves ran at {_range_ratios(results)} of the"
            " fixed run's samples/s (the medians above): its members lease pieces of up to 16"
            " batches from shard 0, a request every 16 steps (docs/running.md), which the"
            " fixed run does not make, and the run ends with its last piece trained by one"
            " member while the others, out of pieces, wait for it: up to 16 steps of one"
            " member alone, a few percent of a 1-epoch run's seconds, paid once a run, not"
            " once an epoch (a fixed run's members each end with their own last batch).",
            f"- {env['cpus']} cores: 3 and 4 members (each a 1-thread process, beside the"
            " server and the launcher) oversubscribe them, so samples/s cannot grow past 2.",
            "- The compared runs alternate so that both sides meet the same load, but on 2"
            " cores single figures are noisy (see the ranges).",
            "- rows_trained_twice counts the rows of a killed member's piece whose updates the"
            " servers folded (its steps since it started the piece times its batch size):"
            " up to 16 batches (1,024 rows) a fault.",
            "- A join's time is the launcher's first `membership` record counting it; the"
            " launcher asks every second, so it can be up to 1 s late, inside the window.",
            "- `ember join` writes its progress to its console, not to metrics.jsonl: the"
            " stalls are those of the launcher's ranks.",
            "- Wall times include the launcher's start (about 2 to 3 s), the same in both runs.",
            "",
        ]
    )


def say(text: str) -> None:
    print(f"[{time.monotonic() - BEGAN:5.0f} s] {text}", flush=True)


def _stalls(outcome: dict[str, Any]) -> str:
    found = [
        f"{c} {outcome[c]['stall']:.2f} s" for c in ("join", "kill", "leave") if outcome.get(c)
    ]
    return ", ".join(found) + f" ({'; '.join(outcome['steps'])})"


def _range_ratios(results: dict[str, Any]) -> str:
    """The lowest and highest median range / fixed ratio over the throughput rows."""
    medians = [
        statistics.median(r["range"]["samples_per_second"] / r["fixed"]["samples_per_second"]
                          for r in runs)
        for by_count in results["throughput"].values()
        for runs in by_count.values()
    ]  # fmt: skip
    return f"{min(medians):.2f}x to {max(medians):.2f}x"


def _epochs(seconds: float, rate: float, data: str) -> int:
    return max(2, math.ceil(seconds * rate / ROWS[data]))


def _rates(pair: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v['samples_per_second']:,.0f} samples/s" for k, v in pair.items())


def _walls(pair: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v['wall_seconds']:.1f} s" for k, v in pair.items())


if __name__ == "__main__":
    raise SystemExit(main())
