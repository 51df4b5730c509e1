"""lab/benchmarks/elastic_figures.py: the stall around a membership change from synthetic progress
records, the times of the changes, and the tables. No runs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lab" / "benchmarks"))

from elastic_figures import (
    change_times,
    fault_table,
    gaps,
    stall,
    stall_table,
    throughput_table,
)


def progress(rank: int, times: list[float], incarnation: int = 0) -> list[dict[str, Any]]:
    """A rank's progress records at these log times, its own clock starting at 0."""
    return [
        {
            "kind": "worker",
            "rank": rank,
            "incarnation": incarnation,
            "time": t,
            "seconds": t - times[0],
        }
        for t in times
    ]


def steady(start: float, end: float, every: float = 0.1) -> list[float]:
    return [round(start + i * every, 3) for i in range(round((end - start) / every) + 1)]


def test_the_stall_is_the_longest_gap_near_the_change_less_the_median_gap() -> None:
    paused = [*steady(0.0, 5.0), *steady(5.8, 10.0)]  # a 0.8 s gap at 5.0
    records = progress(0, paused) + progress(1, steady(0.0, 10.0))
    found = stall(records, at=5.5, changed=None, window=1.0)
    assert found is not None
    assert found["per_rank"]["0"] == pytest.approx(0.7)
    assert found["per_rank"]["1"] == pytest.approx(0.0, abs=1e-9)
    assert found["stall"] == pytest.approx(0.7)


def test_a_gap_outside_the_window_and_the_changed_rank_do_not_count() -> None:
    far = [*steady(0.0, 1.0), *steady(3.0, 10.0)]  # a 2 s gap, far before the change
    records = progress(0, far) + progress(1, [0.0, 4.0, 9.0])  # rank 1 is the one that changed
    found = stall(records, at=8.0, changed=1, window=1.0)
    assert found is not None and list(found["per_rank"]) == ["0"]
    assert found["stall"] == pytest.approx(0.0, abs=1e-9)


def test_no_survivor_near_the_change_is_no_stall() -> None:
    assert stall(progress(0, steady(0.0, 2.0)), at=8.0, changed=None, window=1.0) is None
    assert stall(progress(0, steady(0.0, 9.0)), at=8.0, changed=0, window=1.0) is None


def test_a_restart_is_no_gap_and_a_gap_is_on_the_workers_clock() -> None:
    before = progress(0, [0.0, 1.0, 2.0])
    after = progress(0, [5.0, 5.5], incarnation=1)
    after[1]["seconds"] = 0.25  # the log wrote it late: the worker's own clock says 0.25 s
    found = gaps(before + after)[0]
    assert [g.seconds for g in found] == [1.0, 1.0, 0.25]


def test_change_times_are_the_first_join_the_restart_and_the_leave() -> None:
    records = [
        {"kind": "run", "event": "membership", "time": 0.1, "members": 2, "joins": 0},
        {"kind": "run", "event": "membership", "time": 4.0, "members": 3, "joins": 1},
        {"kind": "run", "event": "membership", "time": 9.0, "members": 3, "joins": 1},
        {"kind": "restart", "rank": 1, "time": 6.0},
        {"kind": "restart", "rank": 0, "time": 7.0},
        {"kind": "done", "rank": 1, "time": 8.0},
        {"kind": "done", "rank": 1, "time": 11.0, "left": True},
    ]
    assert change_times(records, killed=0, left=1) == {"join": 4.0, "kill": 7.0, "leave": 11.0}


def test_the_tables_give_medians_ranges_ratios_and_missed_changes() -> None:
    run = {"join": {"stall": 0.2}, "kill": {"stall": 1.5}, "leave": None}
    table = stall_table({"easgd-async": [run, run, {**run, "join": {"stall": 0.4}}]}, 1.0)
    assert "| `ember join` | 0.20 (0.20–0.40) | yes |" in table
    assert "| SIGKILL, restart | 1.50 | **no** |" in table
    assert "(3 of 3 runs without it) | — |" in table

    pair = {"range": {"samples_per_second": 900.0}, "fixed": {"samples_per_second": 1000.0}}
    assert "| async | 2 | 900 | 1,000 | 0.900 |" in throughput_table({"async": {2: [pair]}})

    side = {"wall_seconds": 50.0, "test_accuracy": 0.98, "epochs": 20, "faults": 0}
    faulted = {**side, "wall_seconds": 55.0, "faults": 3, "rows_trained_twice": 192}
    faulted["pieces_reissued"] = 3
    row = fault_table({"async": [{"clean": side, "faulted": faulted}]}, 1.2).splitlines()[-1]
    assert row == "| async | 20 | 50.0 | 55.0 | 3 | 1.100 | yes | 0.9800 | 0.9800 | 192 | 3 |"
