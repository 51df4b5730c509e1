"""tau_links: what `--tau auto` chooses on an emulated link, and which of its bounds decides.

Runs `ember bench`'s `easgd-async tau=auto` link row (MNIST mlp, 2 workers, 3 epochs, the
Spark engine; worker 0 evaluates deferred copies of the center eight times an epoch) with
`ember train` on the emulated cluster of ember_lab.emulated: driver and server in host 0, one
worker in each of hosts 1 and 2, every link shaped to --link. Per run: the time to test
accuracy 0.97 and samples/s as ember bench reads them, and each tau the workers chose after
their first, with the bounds of docs/tau.md behind it: the
cover of the exchange's wall time (`tau_cover`), the amortization of its cost to compute
(`tau_amortize`, from `c` and `t0`). The run directories stay under --keep, if given.

Needs root, iproute2, Java and pyspark: without them it prints why and exits 0.

Usage: python lab/benchmarks/tau_links.py [--link 100mbit] [--repeat 3] [--keep DIR] [--out F.json]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from common import make_parser, markdown_table, report
from ember.config import RunConfig
from ember.metrics import read_records
from ember.metrics.records import TauChoice, WorkerDone
from ember_lab.bench.hosts import config_file, tc_rate
from ember_lab.bench.record import eval_config, first_reached, run_figures
from ember_lab.bench.rows import BenchSettings, Row, make_tasks, plan_link_rows

RUN_TIMEOUT = 900.0  # seconds for one `ember train` on the cluster, Spark's start included
ROW = "easgd-async tau=auto"  # ember bench's link row this script runs


def auto_row(link: str) -> Row:
    """ember bench's `--tau auto` row on a link (mlp, 3 epochs, 2 worker hosts): its config,
    and its target and the rule for reaching it."""
    settings = BenchSettings(
        out=Path("."), tasks=["mlp"], strategies=[], mllib=False, taus=[], epochs=3, hosts=2,
        torch=False,
    )  # fmt: skip
    tasks = make_tasks(False, settings.lr_rows, settings.lr_features, settings.epochs)
    return next(r for r in plan_link_rows(settings, tasks, link) if r.label == ROW)


def decided_by(change: dict[str, Any]) -> str:
    """The bound behind a tau (period.py's targets): the larger of the cover and the
    amortization, or, coming down, the slowest recent exchange when it asked for more."""
    cover, amortize = change["tau_cover"], change["tau_amortize"]
    if change["tau"] > max(cover, amortize) and change["tau"] <= change["tau_slowest"]:
        return "slowest"
    return "amortize" if amortize > cover else "cover"


def figures(row: Row, run: Path, config: RunConfig) -> dict[str, Any]:
    """One run's figures as ember bench reads them (its time to target counts the final
    parameters too), and the tau changes after each worker's first, with their bounds."""
    bench = run_figures(row, run, config)
    hit = first_reached(row, bench["curve"])
    records = read_records(run / "metrics.jsonl")
    changes = [r.flat() for r in records if isinstance(r, TauChoice) and r.reason == "measured"]
    decided = [
        {
            "rank": r["rank"],
            "step": r["step"],
            "tau": r["tau"],
            "cover": r["tau_cover"],
            "amortize": r.get("tau_amortize"),
            "c": r.get("c"),
            "t0": r.get("t0"),
            "t_comm": r["t_comm"],
            "by": decided_by(r),
        }
        for r in changes
        if r.get("tau_amortize") is not None  # the first changes come before c is measured
    ]
    return {
        "time_to_target": hit[0] if hit else None,
        "samples_per_second": bench["samples_per_second"],
        "final_accuracy": bench["test_accuracy"],
        "exchanges": [r.flat()["exchanges"] for r in records if isinstance(r, WorkerDone)],
        "changes": decided,
    }


def run_all(link: str, repeat: int, keep: Path) -> list[dict[str, Any]]:
    from ember_lab.emulated.netns import Cluster

    # the hosts' processes (Spark's daemons, executors and drivers) import this ember
    source = str(Path(__file__).resolve().parents[2] / "src")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")]))
    row = auto_row(link)
    dataset = row.task.load(seed=0)
    results = []
    with Cluster(3, keep / "cluster-logs", rate=tc_rate(link), worker_cores=1) as cluster:
        for index in range(repeat):
            out = keep / f"run{index}"
            config = replace(eval_config(row, out, dataset), master=cluster.master_url)
            given = config_file(config, keep / f"config{index}.json")
            argv = [sys.executable, "-m", "ember", "train", "--config", str(given)]
            done = cluster.run(0, argv, env=cluster.env(0), timeout=RUN_TIMEOUT)
            if done.returncode != 0:
                raise SystemExit(
                    f"ember train exited with {done.returncode}: {done.stderr[-2000:]}"
                )
            results.append(figures(row, out, config))
            print(f"run {index + 1}/{repeat}: {json.dumps(results[-1])}", flush=True)
    return results


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the runs, and how many of the tau changes each bound decided."""
    changes = [c for r in results for c in r["changes"]]
    reached = [r["time_to_target"] for r in results if r["time_to_target"] is not None]

    def median(key: str) -> float | None:
        values = [c[key] for c in changes if c[key] is not None]
        return statistics.median(values) if values else None

    return {
        "time_to_target": statistics.median(reached) if reached else None,
        "samples_per_second": statistics.median(r["samples_per_second"] for r in results),
        "changes": len(changes),
        "decided_by": {
            b: sum(c["by"] == b for c in changes) for b in ("cover", "amortize", "slowest")
        },
        **{key: median(key) for key in ("tau", "cover", "amortize", "c", "t0", "t_comm")},
    }


def table(results: list[dict[str, Any]]) -> str:
    rows = []
    for index, result in enumerate(results):
        reached = result["time_to_target"]
        for change in result["changes"]:
            rows.append([
                str(index + 1),
                f"{reached:.2f}" if reached is not None else "not reached",
                f"{result['samples_per_second']:,.0f}",
                f"{change['rank']} @ {change['step']}",
                str(change["tau"]),
                str(change["cover"]),
                str(change["amortize"]),
                f"{1e3 * change['c']:.0f}",
                f"{1e3 * change['t0']:.2f}",
                f"{1e3 * change['t_comm']:.0f}",
                change["by"],
            ])  # fmt: skip
    headers = ["run", "time to 0.97 (s)", "samples/s", "worker @ step", "tau", "tau_cover",
               "tau_amortize", "c (ms)", "t0 (ms)", "T_comm (ms)", "decided by"]  # fmt: skip
    return markdown_table(headers, rows)


def unavailable() -> str | None:
    from ember_lab.emulated import netns

    return netns.available() or netns.spark_available()


def main() -> None:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--link", default="100mbit", help="a tc rate, or unlimited")
    parser.add_argument("--keep", type=Path, default=None, help="keep the run directories here")
    parser.set_defaults(repeat=3)
    args = parser.parse_args()
    reason = unavailable()
    if reason:
        print(f"tau_links skipped: {reason}")
        return
    repeat = 1 if args.quick else args.repeat
    with tempfile.TemporaryDirectory(prefix="ember-tau-links-") as scratch:
        results = run_all(args.link, repeat, args.keep or Path(scratch))
    summary = summarize(results)
    text = table(results) + "\n\nmedians: " + json.dumps(summary)
    report(
        "tau_links",
        text,
        {"link": args.link, "repeat": repeat},
        {"summary": summary, "runs": results},
        args.out,
    )


if __name__ == "__main__":
    main()
