"""The calibration's loop figures, read from a calibration run's metrics.jsonl: each worker's
steps between its progress record at the warm-up step and its "done" record."""

from __future__ import annotations

import pytest

from ember.config import Strategy
from ember.errors import EmberError
from ember.metrics.records import Record
from ember_lab.bench.calibrate import _loop_measured


def progress(rank: int, step: int, seconds: float, t_comp: float, t_wait: float) -> Record:
    return Record.from_json(
        {"kind": "worker", "rank": rank, "incarnation": 0, "step": step, "epoch": 1,
         "loss": 0.5, "samples": step * 10, "samples_per_second": 1e3, "seconds": seconds,
         "t_comp": t_comp, "t_wait": t_wait, "exchanges": step // 4}
    )  # fmt: skip


def done(
    rank: int, steps: int, seconds: float, t_comp: float, t_wait: float, exchanges: int = 0
) -> Record:
    return Record.from_json(
        {"kind": "done", "rank": rank, "incarnation": 0, "steps": steps, "samples": steps * 10,
         "seconds": seconds, "aside_seconds": 0.0, "t_comp": t_comp, "t_wait": t_wait,
         "exchanges": exchanges or steps // 4}
    )  # fmt: skip


def test_figures_count_only_the_steps_after_the_warm_up() -> None:
    records = [
        progress(0, 50, 1.0, 0.5, 0.2),
        progress(1, 50, 1.5, 0.6, 0.4),
        progress(0, 100, 9.0, 9.0, 9.0),  # a later record: not the warm-up's
        done(0, 850, 9.0, 6.5, 1.2),  # 800 steps: 8 s of loop, 1 s blocked
        done(1, 850, 9.5, 7.6, 1.4),  # 800 steps: 8 s of loop, 1 s blocked, 7 s timed
    ]
    t_comp, blocked = _loop_measured(records, 2, 50, Strategy.ASYNC)
    # worker 0: loop less blocked (7 s) beats its timed compute (6 s); worker 1's are equal
    assert t_comp == pytest.approx(14.0 / 1600)
    assert blocked == pytest.approx(2.0 / 400)  # 200 exchanges each after the warm-up


def test_a_worker_without_figures_is_one_clear_error() -> None:
    records = [progress(0, 50, 1.0, 0.5, 0.2), done(0, 850, 9.0, 6.5, 1.2)]
    with pytest.raises(EmberError, match=r"calibrating .*a worker did not report"):
        _loop_measured(records, 2, 50, Strategy.BSP)


def test_single_has_no_exchanges_and_blocks_for_none() -> None:
    records = [progress(0, 50, 1.0, 0.9, 0.0), done(0, 850, 9.0, 8.5, 0.0, exchanges=50 // 4)]
    t_comp, blocked = _loop_measured(records, 1, 50, Strategy.SINGLE)
    assert (t_comp, blocked) == (pytest.approx(8.0 / 800), 0.0)
