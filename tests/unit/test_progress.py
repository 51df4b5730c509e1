"""What a user sees while a run runs: named start-up phases, one speed, a truthful estimate."""

from __future__ import annotations

import io
import re
from typing import Any

from ember.engines.progress import Progress
from ember.metrics.records import Record
from ember.worker.loop import CENTER_SOURCE

# What a test leaves out of a record: fields the bar does not read
UNREAD: dict[str, dict[str, Any]] = {
    "start": {"incarnation": 0, "first_step": 0, "total_steps": 100},
    "worker": {"incarnation": 0, "t_comp": 0.0},
    "eval": {"step": 1, "epoch_end": False, "seconds": 0.0, "samples": 0},
    "diverged": {"incarnation": 0},
    "note": {},
}


def update(progress: Progress, line: dict[str, Any]) -> None:
    """A worker's record as the launcher gets it: decoded from the line it sent."""
    progress.update(Record.from_json({**UNREAD[line["kind"]], **line}))


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def worker(rank: int, step: int, speed: float, epoch: int = 1) -> dict:
    return {
        "kind": "worker",
        "rank": rank,
        "step": step,
        "epoch": epoch,
        "loss": 0.5,
        "samples": step * 10,
        "samples_per_second": speed,
    }


def test_a_non_terminal_gets_each_phase_in_order_then_one_line_per_epoch() -> None:
    out = io.StringIO()
    with Progress(stream=out) as progress:
        progress.phase("loading data")
        progress.phase("starting parameter servers")
        progress.phase("starting workers")
        progress.start(total=4000, workers=2, samples_per_step=10)
        update(progress, {"kind": "start", "rank": 0})
        update(progress, {"kind": "start", "rank": 1})
        update(progress, worker(0, 50, 1000.0))
        update(progress, worker(1, 50, 3000.0))
        within = {"kind": "eval", "rank": 0, "epoch": 1, "test_accuracy": 0.5}
        update(progress, {**within, "epoch_end": False})  # --eval-every: not the epoch's figure
        for _ in range(2):  # an epoch replayed (the rows of a finished Spark stage) is said once
            end = {"kind": "eval", "rank": 0, "epoch": 1, "test_accuracy": 0.9, "epoch_end": True}
            update(progress, end)
        center = {"source": CENTER_SOURCE, "kind": "eval", "epoch": 2, "test_accuracy": 0.95}
        update(progress, {**center, "epoch_end": True})  # easgd's worker 0 evaluates the center
        # a Spark task's evaluation on the test rows it was handed, fewer than the test set
        subset = {**center, "epoch": 3, "test_set": "subset of 1,000 rows", "epoch_end": True}
        update(progress, subset)
        update(progress, {**center, "epoch": 4, "test_set": "all 2,000 rows", "epoch_end": True})
        diverged = {"kind": "diverged", "rank": 1, "step": 37, "epoch": 4, "loss": "nan"}
        for _ in range(2):  # said once per worker
            update(progress, diverged)
    assert out.getvalue().splitlines() == [
        "ember: loading data",
        "ember: starting parameter servers",
        "ember: starting workers",
        "ember: waiting for the first step",
        "epoch 1: test accuracy 0.9000 (worker 0's parameters), 4,000 samples/s",
        "epoch 2: test accuracy 0.9500 (center as of worker 0's last exchange), 4,000 samples/s",
        "epoch 3: test accuracy 0.9500 (center as of worker 0's last exchange, subset of"
        " 1,000 rows), 4,000 samples/s",
        "epoch 4: test accuracy 0.9500 (center as of worker 0's last exchange), 4,000 samples/s",
        "ember: warning: worker 1's training loss is nan at step 37 (epoch 4): training has"
        " diverged; a lower --lr usually helps",
    ]


def test_a_divergence_is_said_even_without_the_bar() -> None:
    out = io.StringIO()
    with Progress(enabled=False, stream=out) as progress:
        update(progress, {"kind": "diverged", "rank": 0, "step": 3, "epoch": 1, "loss": "inf"})
        progress.note("epoch 1: not said")
    assert out.getvalue().splitlines() == [
        "ember: warning: worker 0's training loss is inf at step 3 (epoch 1): training has"
        " diverged; a lower --lr usually helps"
    ]


def test_the_bar_shows_one_speed_the_workers_summed_samples_per_second() -> None:
    with Progress(stream=Terminal()) as progress:
        progress.start(total=100_000, workers=2, samples_per_step=10)
        update(progress, worker(0, 100, 30_000.0))
        update(progress, worker(1, 100, 54_612.0))
        line = str(progress)
    assert len(re.findall(r"/s\b", line)) == 1, line
    assert "84,612 samples/s" in line


def test_no_time_left_is_estimated_before_the_workers_report_a_rate() -> None:
    with Progress(stream=Terminal()) as progress:
        progress.phase("starting workers")
        progress.start(total=100_000, workers=2, samples_per_step=10)
        update(progress, {"kind": "start", "rank": 0})
        update(progress, {"kind": "start", "rank": 1})
        waiting = str(progress)
        update(progress, worker(0, 100, 1_000.0))
        update(progress, worker(1, 100, 1_000.0))
        training = str(progress)
    assert waiting == "ember: waiting for the first step..."
    # 98,000 samples left at the workers' 2,000 samples/s
    assert "2,000 samples/s, 00:49 left" in training, training


def test_the_progress_line_says_when_training_is_input_bound() -> None:
    out = io.StringIO()
    with Progress(stream=out) as progress:
        progress.start(total=4000, workers=2, samples_per_step=10)
        for rank, waiting in ((0, 0.7), (1, 0.5)):
            update(progress,
                {"kind": "worker", "rank": rank, "step": 5, "epoch": 1, "loss": 0.5,
                 "samples": 50, "samples_per_second": 100.0, "data_wait_fraction": waiting}
            )  # fmt: skip
        update(progress, {"kind": "eval", "epoch": 1, "epoch_end": True, "test_accuracy": 0.5})
        assert progress.input_bound() == "input-bound: 60% of the time waiting on data"
    assert out.getvalue().rstrip().endswith("input-bound: 60% of the time waiting on data")


def test_a_note_the_workers_send_alike_is_said_once() -> None:
    out = io.StringIO()
    with Progress(stream=out) as progress:
        for rank in (0, 1, 0):
            update(progress, {"kind": "note", "rank": rank, "text": "ember: data mode auto: …"})
        update(progress, {"kind": "note", "rank": 1, "text": "ember: another"})
    assert out.getvalue().splitlines() == ["ember: data mode auto: …", "ember: another"]


def test_an_epoch_line_gives_the_rate_over_that_epoch_from_the_evaluations_counts() -> None:
    """Not the last progress record's rate, which an epoch shorter than --log-every never
    updates (it said the previous epoch's rate, or 0 samples/s before the first)."""
    out = io.StringIO()
    with Progress(stream=out) as progress:
        progress.start(total=40000, workers=2, samples_per_step=10)
        end = {"kind": "eval", "rank": 0, "epoch_end": True, "test_accuracy": 0.9}
        update(progress, {**end, "epoch": 1, "samples": 8000, "seconds": 4.0})
        update(progress, worker(0, 50, 1000.0))  # a stale rate, which the next line ignores
        update(progress, {**end, "epoch": 2, "samples": 16000, "seconds": 6.0})
    assert out.getvalue().splitlines() == [
        "epoch 1: test accuracy 0.9000 (worker 0's parameters), 2,000 samples/s",
        "epoch 2: test accuracy 0.9000 (worker 0's parameters), 4,000 samples/s",
    ]


def test_the_python_api_shows_progress_where_someone_watches(monkeypatch) -> None:
    """ember.fit, ember.run and ember.spark.fit default to show_progress=None: on a terminal
    the phases, the bar and the epoch lines; in a log or a notebook's pipe, nothing."""
    import inspect
    import sys

    import ember
    from ember.config import RunConfig
    from ember.engines import ParsedRun

    for api in (ember.fit, ember.run, ember.spark.fit):
        assert inspect.signature(api).parameters["show_progress"].default is None
    run = ParsedRun(RunConfig(), show_progress=None)
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert run.progress_shown
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not run.progress_shown
    assert ParsedRun(RunConfig(), show_progress=True).progress_shown  # lines into the log
