"""metrics.jsonl records: each record type writes the line its kind has always had."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ember.config import RunConfig
from ember.metrics import MetricsLog, read_metrics, summarize_workers, write_json
from ember.metrics.records import (
    Divergence,
    Evaluation,
    Failure,
    FinalState,
    Note,
    Record,
    Returned,
    RunEvent,
    RunSummary,
    ServerEvent,
    TauChoice,
    Unreachable,
    WorkerDone,
    WorkerError,
    WorkerProgress,
    WorkerRestart,
    WorkerStart,
)
from ember.worker.loop import WorkerSpec, run_worker

COMM = {
    "t_comm": 0.5,
    "t_wait": 0.25,
    "bytes_pushed": 100,
    "bytes_pulled": 200,
    "exchanges": 3,
    "staleness_max": 2,
    "staleness_mean": 1.0,
    "lanes": 1,
}
DATA = {  # how a worker got its rows (data/streaming.py's DataCounters)
    "data_mode": "memory",
    "rows_read": 2560,
    "data_wait_seconds": 0.1,
    "read_wait_seconds": 0.0,
    "peak_rss_bytes": 300 << 20,
}
CONFIG = {"strategy": "single", "workers": 1}
SERVER_EVENT = {"event": "failover", "server": "shard 0", "to": "tcp://127.0.0.1:5001"}

# Each record beside the dict the code wrote for its kind before records had types.
SHAPES: list[tuple[Record, dict[str, Any]]] = [
    (
        WorkerStart(rank=1, incarnation=0, first_step=5, total_steps=50),
        {"kind": "start", "rank": 1, "incarnation": 0, "first_step": 5, "total_steps": 50},
    ),
    (
        WorkerProgress(
            rank=1,
            incarnation=2,
            step=10,
            epoch=1,
            loss=0.5,
            samples=640,
            samples_per_second=1e4,
            t_comp=0.1,
            seconds=0.2,
            data_wait_fraction=0.25,
            lr=0.05,
            comm=COMM,
        ),
        {
            "kind": "worker",
            "rank": 1,
            "incarnation": 2,
            "step": 10,
            "epoch": 1,
            "loss": 0.5,
            "samples": 640,
            "samples_per_second": 1e4,
            "t_comp": 0.1,
            "seconds": 0.2,
            "data_wait_fraction": 0.25,
            "lr": 0.05,
            **COMM,
        },
    ),
    (
        Evaluation(
            epoch=2,
            step=20,
            epoch_end=True,
            seconds=1.5,
            samples=2560,
            scores={"test_accuracy": 0.9, "test_loss": 0.3},
        ),
        {
            "kind": "eval",
            "rank": 0,
            "epoch": 2,
            "step": 20,
            "epoch_end": True,
            "seconds": 1.5,
            "samples": 2560,
            "test_accuracy": 0.9,
            "test_loss": 0.3,
            "source": "worker 0 local parameters",
            "test_rows": 0,
        },
    ),
    (
        WorkerDone(
            rank=0,
            incarnation=1,
            steps=40,
            samples=2560,
            seconds=2.0,
            aside_seconds=0.5,
            t_comp=1.5,
            comm=COMM,
            data=DATA,
        ),
        {
            "kind": "done",
            "rank": 0,
            "incarnation": 1,
            "steps": 40,
            "samples": 2560,
            "seconds": 2.0,
            "aside_seconds": 0.5,
            "t_comp": 1.5,
            **COMM,
            **DATA,
            "device": "cpu",
            "gpu": None,
        },
    ),
    (
        WorkerError(rank=1, incarnation=0, error="ValueError: bad\ntraceback"),
        {
            "kind": "error",
            "rank": 1,
            "incarnation": 0,
            "error": "ValueError: bad\ntraceback",
            "retry": True,
        },
    ),
    (
        Divergence(rank=1, incarnation=0, step=37, epoch=2, loss="nan"),
        {"kind": "diverged", "rank": 1, "incarnation": 0, "step": 37, "epoch": 2, "loss": "nan"},
    ),
    (
        WorkerRestart(rank=1, incarnation=1, exitcode=-9, error=""),
        {"kind": "restart", "rank": 1, "incarnation": 1, "exitcode": -9, "error": ""},
    ),
    (
        Failure(rank=1, exitcode=None, error="boom"),
        {"kind": "failure", "rank": 1, "exitcode": None, "error": "boom"},
    ),
    (Failure(error="boom"), {"kind": "failure", "exitcode": None, "error": "boom"}),
    (
        Returned(value="gqFhAQ=="),
        {"kind": "returned", "rank": 0, "value": "gqFhAQ==", "error": None},
    ),
    (
        Note(rank=1, text="partition 1 is empty"),
        {"kind": "note", "rank": 1, "text": "partition 1 is empty"},
    ),
    (
        Unreachable(rank=0, error="tcp://10.0.0.1:5000: no answer"),
        {"kind": "unreachable", "rank": 0, "error": "tcp://10.0.0.1:5000: no answer"},
    ),
    (
        FinalState(rendezvous="127.0.0.1:29500", step=3, size=2, params="AAAAAAAAgD8="),
        {
            "kind": "state",
            "rank": 0,
            "rendezvous": "127.0.0.1:29500",
            "step": 3,
            "size": 2,
            "params": "AAAAAAAAgD8=",
        },
    ),
    (
        RunEvent(event="start", details={"checkpoint": None, "config": CONFIG}),
        {"kind": "run", "event": "start", "checkpoint": None, "config": CONFIG},
    ),
    (
        RunEvent(event="final checkpoint skipped: a server is down"),
        {"kind": "run", "event": "final checkpoint skipped: a server is down"},
    ),
    (
        RunEvent(event="final checkpoint", details={"path": "/runs/x/checkpoints/3"}),
        {"kind": "run", "event": "final checkpoint", "path": "/runs/x/checkpoints/3"},
    ),
    (
        RunEvent(
            event="partitions",
            details={"partitions": 4, "repartitioned": False, "unused_rows": 12},
        ),
        {
            "kind": "run",
            "event": "partitions",
            "partitions": 4,
            "repartitioned": False,
            "unused_rows": 12,
        },
    ),
    (
        RunEvent(event="stage retry", details={"attempt": 1}),
        {"kind": "run", "event": "stage retry", "attempt": 1},
    ),
    (ServerEvent(details=SERVER_EVENT), {"kind": "server", **SERVER_EVENT}),
    (
        RunSummary(scores={"test_accuracy": 0.98, "test_loss": 0.06}),
        {"kind": "summary", "test_accuracy": 0.98, "test_loss": 0.06},
    ),
    (
        TauChoice(
            rank=1,
            incarnation=0,
            step=24,
            policy="auto",
            reason="measured",
            tau=40,
            previous=8,
            t_comp=0.0015,
            t_comm=0.05,
            details={"t0": 0.0014, "c": 0.001},
        ),
        {
            "kind": "tau",
            "rank": 1,
            "incarnation": 0,
            "step": 24,
            "policy": "auto",
            "reason": "measured",
            "tau": 40,
            "previous": 8,
            "t_comp": 0.0015,
            "t_comm": 0.05,
            "t0": 0.0014,
            "c": 0.001,
        },
    ),
    (
        WorkerProgress(
            rank=0,
            incarnation=0,
            step=28,
            epoch=2,
            loss=0.25,
            samples=1792,
            samples_per_second=2e4,
            t_comp=0.2,
            comm=COMM,
            reported=("loss", "accuracy"),
            metrics={"accuracy": 0.9},
        ),
        {
            "kind": "worker",
            "rank": 0,
            "incarnation": 0,
            "step": 28,
            "epoch": 2,
            "loss": 0.25,
            "samples": 1792,
            "samples_per_second": 2e4,
            "t_comp": 0.2,
            **COMM,
            "reported": ("loss", "accuracy"),
            "accuracy": 0.9,
        },
    ),
]


@pytest.mark.parametrize(("record", "shape"), SHAPES, ids=lambda v: getattr(v, "kind", ""))
def test_each_record_writes_the_keys_and_values_of_its_kind_in_order(
    record: Record, shape: dict[str, Any]
) -> None:
    assert list(record.to_json().items()) == list(shape.items())


def test_every_record_type_has_a_shape_pinned() -> None:
    assert {type(record) for record, _ in SHAPES} == set(Record.__subclasses__())


def test_records_are_frozen() -> None:
    record = RunSummary(scores={"test_accuracy": 0.98, "test_loss": 0.06})
    with pytest.raises(AttributeError):
        record.test_accuracy = 0.5  # type: ignore[misc]


def test_metrics_log_writes_a_record_as_the_line_of_its_shape(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / "metrics.jsonl")
    for record, _ in SHAPES:
        log.write(record)
    log.close()
    lines = read_metrics(tmp_path / "metrics.jsonl")
    assert all(next(iter(line)) == "time" for line in lines)
    untimed = [{k: v for k, v in line.items() if k != "time"} for line in lines]
    assert untimed == [json.loads(json.dumps(s)) for _, s in SHAPES]


def test_json_files_hold_null_for_a_float_that_is_not_finite(tmp_path: Path) -> None:
    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    values = {"loss": float("nan"), "rows": [1.5, float("inf")], "x": np.float32("-inf")}
    write_json(tmp_path / "summary.json", {**values, "nested": {"y": float("nan")}})
    text = (tmp_path / "summary.json").read_text()
    assert json.loads(text, parse_constant=refuse) == {
        "loss": None,
        "rows": [1.5, None],
        "x": None,
        "nested": {"y": None},
    }
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write(RunSummary(scores={"test_accuracy": 0.1, "test_loss": float("nan")}))
    log.close()
    line = json.loads((tmp_path / "metrics.jsonl").read_text(), parse_constant=refuse)
    assert (line["test_accuracy"], line["test_loss"]) == (0.1, None)


def _train_single(
    tmp_path: Path, stop: threading.Event | None = None, eval_every: int = 0
) -> list[dict[str, Any]]:
    config = RunConfig(
        data="synthetic-lr",
        model="logreg",
        strategy="single",
        workers=1,
        epochs=2,
        batch_size=64,
        synthetic_samples=640,
        synthetic_features=8,
        log_every=5,
        eval_every=eval_every,
    ).validate()
    reported: list[Record] = []
    spec = WorkerSpec(config, 0, 1, run_dir=str(tmp_path))
    reported.append(run_worker(spec, reported.append, stop=stop))
    assert all(isinstance(record, Record) for record in reported)
    return [record.to_json() for record in reported]  # as they leave the worker's process


def test_a_worker_reports_start_progress_evals_and_done(tmp_path: Path) -> None:
    reported = _train_single(tmp_path)
    kinds = [record["kind"] for record in reported]
    assert kinds == ["start"] + (["worker"] * 2 + ["eval"]) * 2 + ["done"]
    comm = list(COMM)
    assert list(reported[0]) == [*SHAPES[0][1]]
    assert list(reported[1]) == [*SHAPES[1][1]] and list(reported[1])[-len(comm) :] == comm
    assert list(reported[3]) == [*SHAPES[2][1]]
    assert list(reported[-1]) == [*SHAPES[3][1]]
    assert [r["step"] for r in reported if r["kind"] == "worker"] == [5, 10, 15, 20]
    evaluations = [(r["epoch"], r["step"], r["epoch_end"]) for r in reported if r["kind"] == "eval"]
    assert evaluations == [(1, 10, True), (2, 20, True)]
    done = reported[-1]
    assert (done["steps"], done["samples"]) == (20, 1280)
    assert 0 < done["t_comp"] <= done["seconds"]
    assert (tmp_path / "checkpoints").is_dir()  # worker 0 of a strategy without a server saves


def test_evaluations_within_an_epoch_are_told_from_its_end(tmp_path: Path) -> None:
    reported = _train_single(tmp_path, eval_every=4)  # 10 steps an epoch
    evaluations = [(r["step"], r["epoch_end"]) for r in reported if r["kind"] == "eval"]
    assert evaluations == [(4, False), (8, False), (10, True), (12, False), (16, False), (20, True)]


def test_a_stopped_worker_reports_no_steps_and_still_totals_up(tmp_path: Path) -> None:
    stop = threading.Event()
    stop.set()
    reported = _train_single(tmp_path, stop)
    assert [record["kind"] for record in reported] == ["start", "done"]
    assert (reported[-1]["steps"], reported[-1]["samples"]) == (0, 0)


def test_a_user_loops_reported_metrics_are_tensorboard_scalars_too(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = MetricsLog(tmp_path / "metrics.jsonl", tensorboard=True)
    for step, seen in ((10, 640), (20, 1280)):
        record = WorkerProgress(
            rank=0,
            incarnation=0,
            step=step,
            epoch=1,
            loss=0.5,
            samples=seen,
            samples_per_second=1e3,
            t_comp=0.1,
            reported=("loss", "seen"),
            metrics={"seen": seen},
        )
        log.write(record)
    log.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert {"worker/0/loss", "worker/0/seen"} <= set(events.Tags()["scalars"])
    assert [(e.step, e.value) for e in events.Scalars("worker/0/seen")] == [(10, 640), (20, 1280)]


def test_the_summary_says_the_data_mode_and_each_workers_rows_and_waits() -> None:
    done = [
        {"rank": r, "seconds": 1.0, "samples": 10, "data_mode": "stream", "rows_read": 100 + r,
         "data_wait_seconds": 0.5, "read_wait_seconds": 0.25, "peak_rss_bytes": 9}
        for r in range(2)
    ]  # fmt: skip
    summary = summarize_workers(done, 2.0)
    assert summary["data_mode"] == "stream" and summary["rows_read"] == 201
    assert summary["data_wait_seconds"] == 1.0
    assert summary["data_per_worker"]["1"] == {
        "rows_read": 101,
        "data_wait_seconds": 0.5,
        "read_wait_seconds": 0.25,
        "peak_rss_bytes": 9,
    }


@pytest.mark.parametrize(("record", "shape"), SHAPES, ids=lambda v: getattr(v, "kind", ""))
def test_a_line_read_back_is_the_record_that_wrote_it(
    record: Record, shape: dict[str, Any]
) -> None:
    line = {"time": 1.5, **json.loads(json.dumps(shape))}  # as metrics.jsonl holds it
    read = Record.from_json(line)
    assert type(read) is type(record)
    assert read.to_json() == json.loads(json.dumps(record.to_json()))


def test_a_spark_tasks_tags_ride_along_and_stay_out_of_the_scores() -> None:
    line = {**SHAPES[2][1], "incarnation": 7, "attempt": 1, "test_set": "all 10 rows"}
    read = Record.from_json(line)
    assert isinstance(read, Evaluation)
    assert (read.incarnation, read.attempt, read.test_set) == (7, 1, "all 10 rows")
    assert read.scores == {"test_accuracy": 0.9, "test_loss": 0.3}


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ({"rank": 0}, "unknown record kind None; known: diverged, done, error, eval, failure,"),
        ({"kind": "weird"}, "unknown record kind 'weird'; known:"),
        (
            {"kind": "note", "rank": 0, "text": "x", "color": 1},
            "a 'note' record has no field 'color'",
        ),
        ({"kind": "start", "rank": 0}, "a 'start' record: "),
    ],
)
def test_a_line_that_is_no_record_is_one_clear_error(line: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        Record.from_json(line)
