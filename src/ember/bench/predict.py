"""The throughput model beside the measurement: calibrate once per task, predict every row."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ember.bench.calibrate import calibrate
from ember.config import AlgorithmKind, RunConfig, Strategy
from ember.perfmodel import Calibration, Network, evaluation_wait, predict, time_to_target
from ember.worker import evaluates_after


def calibrate_tasks(
    settings: Any, tasks: dict[str, Any], log: Callable[[str], None]
) -> dict[str, Calibration]:
    """A short calibration run per task that has ember rows, before a repetition's rows."""
    calibrations = {}
    for name in settings.tasks:
        task = tasks[name]
        config = RunConfig(
            data=task.data,
            model=task.model,
            seed=settings.seed,
            synthetic_samples=task.synthetic_samples,
            synthetic_features=task.synthetic_features,
        ).validate()
        log(f"calibrating the throughput model for {name} ({task.model} on {task.data})")
        calibrations[name] = calibrate(config, task.load(settings.seed))
    return calibrations


def add_predictions(
    records: list[dict[str, Any]],
    calibrations: list[dict[str, Calibration]],
    *,
    network: Network | None = None,
) -> None:
    """Set predicted_samples_per_second and prediction_error on every ember row, and, where
    the row's divergence d is known, predicted_time_to_target (d times single's samples to
    target, at the predicted speed) and time_to_target_error.

    `network` is the link the rows ran over, with its measured rate; None means all of a row's
    processes on this host, sharing its cores, as the local bench runs them. Either way the
    other workers wait out worker 0's evaluations for the curve where the strategy makes them.
    Each row is predicted from its own repetition's calibration (`calibrations[repeat]`), and
    with its own compression."""
    link = network or Network(bandwidth=None, cores=os.cpu_count() or 1)
    single = {
        (r["task"], r.get("repeat", 0)): r["samples_to_target"]
        for r in records
        if r.get("strategy") == Strategy.SINGLE and r.get("samples_to_target")
    }
    for record in records:
        record["predicted_samples_per_second"] = record["prediction_error"] = None
        record["predicted_time_to_target"] = record["time_to_target_error"] = None
        repeat = record.get("repeat", 0)
        by_task = calibrations[repeat] if repeat < len(calibrations) else {}
        calibration = by_task.get(record["task"])
        config = record.get("config") or {}
        if record["system"] != "ember" or calibration is None or not config:
            continue
        try:
            calibration = calibration.compressed(config.get("compress") or "none")
        except ValueError:  # a codec the model has no byte count for: no prediction
            continue
        easgd = Strategy(config["strategy"]).algorithm is AlgorithmKind.EASGD
        period = config["tau"] if easgd else config["n_push"]
        predicted = predict(
            config["strategy"], config["workers"], calibration, link, period, config["servers"]
        ).samples_per_second
        samples = record.get("samples") or 0
        if samples:  # the loop's time at that speed, and the waits for worker 0's evaluations
            wait = evaluation_wait(config["strategy"], _evaluations(config, samples), calibration)
            predicted = samples / (samples / predicted + wait)
        record["predicted_samples_per_second"] = predicted
        measured = record.get("samples_per_second")
        if record["status"] == "ok" and measured:
            record["prediction_error"] = (predicted - measured) / measured
        base, d = single.get((record["task"], repeat)), record.get("divergence")
        if base and d:
            ttt = time_to_target(predicted, base, d)
            record["predicted_time_to_target"] = ttt
            if record.get("time_to_target"):
                record["time_to_target_error"] = ttt / record["time_to_target"] - 1


def _evaluations(config: dict[str, Any], samples: int) -> int:
    """How many times worker 0 evaluated in a row of `samples` samples in all."""
    steps = samples // config["workers"] // config["batch_size"]
    per_epoch = max(1, steps // config["epochs"])
    return sum(evaluates_after(step, per_epoch, config["eval_every"]) for step in range(steps))
