"""The figures of elastic.py from a run directory's metrics.jsonl, and their tables: no runs here.

A progress record ("kind": "worker") carries the log's `time` (seconds since the launcher opened
metrics.jsonl) and the worker's own `seconds` (its training loop so far, without evaluations and
checkpoints). A gap between two consecutive records of one rank and incarnation is measured on
the worker's clock (`seconds`), and placed on the log's (`time`) to find the gaps around a change.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import fmt, markdown_table


@dataclass(frozen=True)
class Gap:
    rank: int
    start: float  # the log's time of the earlier record
    end: float  # the log's time of the later one
    seconds: float  # the worker's own seconds between them


def read_records(run: Path) -> list[dict[str, Any]]:
    """metrics.jsonl as written so far (the launcher may be mid-line)."""
    path, records = run / "metrics.jsonl", []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def gaps(records: Iterable[dict[str, Any]]) -> dict[int, list[Gap]]:
    """Each rank's gaps between consecutive progress records of the same incarnation."""
    last: dict[tuple[int, int], dict[str, Any]] = {}
    found: dict[int, list[Gap]] = defaultdict(list)
    for record in records:
        if record.get("kind") != "worker":
            continue
        key = (record["rank"], record.get("incarnation", 0))
        before = last.get(key)
        last[key] = record
        if before is None:
            continue
        clock = "seconds" if "seconds" in record and "seconds" in before else "time"
        seconds = record[clock] - before[clock]
        found[record["rank"]].append(Gap(record["rank"], before["time"], record["time"], seconds))
    return dict(found)


def stall(
    records: Sequence[dict[str, Any]], at: float, changed: int | None, window: float
) -> dict[str, Any] | None:
    """The survivors' stall around a change at the log's time `at`: for each rank but `changed`
    with gaps overlapping [at - window, at + window], its longest such gap less its median gap
    over the run (never below 0); the change's stall is the largest. None: no survivor seen."""
    per_rank: dict[str, float] = {}
    for rank, found in sorted(gaps(records).items()):
        near = [g.seconds for g in found if g.end >= at - window and g.start <= at + window]
        if rank == changed or not near:
            continue
        median = statistics.median(g.seconds for g in found)
        per_rank[str(rank)] = max(0.0, max(near) - median)
    if not per_rank:
        return None
    return {"at": round(at, 2), "stall": max(per_rank.values()), "per_rank": per_rank}


def change_times(records: Sequence[dict[str, Any]], killed: int, left: int) -> dict[str, float]:
    """The log's time of each change: the first membership record counting a join (the launcher
    asks every second, so up to a second late), `killed`'s restart, `left`'s leaving `done`."""
    times: dict[str, float] = {}
    for r in records:
        kind = r.get("kind")
        if kind == "run" and r.get("event") == "membership" and r.get("joins", 0) >= 1:
            times.setdefault("join", r["time"])
        elif kind == "restart" and r.get("rank") == killed:
            times.setdefault("kill", r["time"])
        elif kind == "done" and r.get("rank") == left and r.get("left"):
            times.setdefault("leave", r["time"])
    return times


CHANGES = {"join": "`ember join`", "leave": "`ember leave --worker 1`", "kill": "SIGKILL, restart"}


def stall_table(results: dict[str, Any], target: float) -> str:
    """One row per change, a column per strategy: the median stall (min-max) over the runs."""
    strategies = list(results)
    rows = []
    for change, label in CHANGES.items():
        row = [label]
        for strategy in strategies:
            values = [r[change]["stall"] for r in results[strategy] if r.get(change)]
            row.append(fmt(_spread(values), 2) + _missed(len(values), len(results[strategy])))
        worst = max((v for v in _medians(results, change)), default=None)
        row.append("—" if worst is None else ("yes" if worst <= target else "**no**"))
        rows.append(row)
    headers = ["change", *(f"{s} stall (s)" for s in strategies), f"<= {target:g} s"]
    return markdown_table(headers, rows)


def throughput_table(results: dict[str, Any]) -> str:
    """Per strategy and member count: samples/s of the range and the fixed run, and their ratio."""
    rows = []
    for strategy, by_count in results.items():
        for count, runs in by_count.items():
            ranged = _spread([r["range"]["samples_per_second"] for r in runs])
            fixed = _spread([r["fixed"]["samples_per_second"] for r in runs])
            ratio = _spread(
                [r["range"]["samples_per_second"] / r["fixed"]["samples_per_second"] for r in runs]
            )
            rows.append([strategy, str(count), fmt(ranged, 0), fmt(fixed, 0), fmt(ratio, 3)])
    headers = ["strategy", "members", "range N:4 samples/s", "fixed N samples/s", "range / fixed"]
    return markdown_table(headers, rows)


def fault_table(results: dict[str, Any], target: float) -> str:
    """Per strategy: wall time with and without faults, their ratio, accuracy, rows redone."""
    rows = []
    for strategy, runs in results.items():
        ratio = _spread([r["faulted"]["wall_seconds"] / r["clean"]["wall_seconds"] for r in runs])
        rows.append(
            [
                strategy,
                str(runs[0]["faulted"]["epochs"]),
                fmt(_spread([r["clean"]["wall_seconds"] for r in runs]), 1),
                fmt(_spread([r["faulted"]["wall_seconds"] for r in runs]), 1),
                fmt(_spread([float(r["faulted"]["faults"]) for r in runs]), 0),
                fmt(ratio, 3),
                "yes" if ratio["median"] <= target else "**no**",
                fmt(_spread([r["clean"]["test_accuracy"] for r in runs]), 4),
                fmt(_spread([r["faulted"]["test_accuracy"] for r in runs]), 4),
                fmt(_spread([float(r["faulted"]["rows_trained_twice"]) for r in runs]), 0),
                fmt(_spread([float(r["faulted"]["pieces_reissued"]) for r in runs]), 0),
            ]
        )
    headers = [
        "strategy", "epochs", "wall s, no faults", "wall s, faults", "faults", "faults / none",
        f"<= {target:g}x", "accuracy, no faults", "accuracy, faults", "rows_trained_twice",
        "pieces_reissued",
    ]  # fmt: skip
    return markdown_table(headers, rows)


def _spread(values: Sequence[float]) -> dict[str, Any]:
    if not values:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan")}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _medians(results: dict[str, Any], change: str) -> list[float]:
    medians = []
    for runs in results.values():
        values = [r[change]["stall"] for r in runs if r.get(change)]
        if values:
            medians.append(statistics.median(values))
    return medians


def _missed(seen: int, runs: int) -> str:
    return "" if seen == runs else f" ({runs - seen} of {runs} runs without it)"
