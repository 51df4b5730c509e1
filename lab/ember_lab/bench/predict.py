"""The throughput model beside the measurement: calibrate once per task, predict every row."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any

from ember.config import RunConfig, Strategy
from ember.probe import evaluates_after
from ember_lab.bench.calibrate import LOOP_STEPS, QUICK_LOOP_STEPS, calibrate
from ember_lab.emulated.netns import BURST_BYTES
from ember_lab.perfmodel import (
    AUTO_MARGIN,
    Calibration,
    LinkExchange,
    Network,
    closing_seconds,
    evaluation_wait,
    model_tau,
    predict,
    time_to_target,
)

# One-way seconds of a link whose rows recorded no latency: what runs before it was measured
# assumed for veths and a bridge.
UNMEASURED_LATENCY = 1e-4


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
        steps = QUICK_LOOP_STEPS if settings.quick else LOOP_STEPS
        calibrations[name] = calibrate(config, task.load(settings.seed), steps)
    return calibrations


def add_predictions(
    records: list[dict[str, Any]],
    calibrations: list[dict[str, Calibration]],
    *,
    network: Network | None = None,
    among: list[dict[str, Any]] | None = None,
) -> None:
    """Set predicted_samples_per_second and prediction_error on every ember row, and, where
    the row's divergence d is known, predicted_time_to_target (d times single's samples to
    target, at the predicted speed) and time_to_target_error.

    `network` is the link the rows ran over, with its measured rate; None means all of a row's
    processes on this host, sharing its cores, as the local bench runs them. Either way the
    other workers wait out worker 0's evaluations for the curve where the strategy makes them,
    and each worker's loop ends with easgd's last exchanges (perfmodel.closing_seconds).
    Each row is predicted from its own repetition's calibration (`calibrations[repeat]`), and
    with its own compression. A row's d, before the bench sets it, is its samples to target
    over single's in its link's rows, else in the rows on this host, of `among` (all the
    records; `records` when left out)."""
    link = network or Network(bandwidth=None, cores=os.cpu_count() or 1)
    single = {
        (r["task"], r.get("repeat", 0), r.get("link")): r["samples_to_target"]
        for r in (records if among is None else among)
        if r.get("strategy") == Strategy.SINGLE and r.get("samples_to_target")
    }
    for record in records:
        record["predicted_samples_per_second"] = record["prediction_error"] = None
        record["predicted_time_to_target"] = record["time_to_target_error"] = None
        repeat = record.get("repeat", 0)
        by_task = calibrations[repeat] if repeat < len(calibrations) else {}
        calibration = by_task.get(record["task"])
        config = _as_ember(record)
        if calibration is None or not config:
            continue
        try:
            calibration = calibration.compressed(config.get("compress") or "none")
        except ValueError:  # a codec the model has no byte count for: no prediction
            continue
        # the periods the run chose, each for the steps it ran; the closing exchanges at the
        # one it ran most at
        spans, cover = _spans(record, config), 1
        if spans:
            cover = _cover(config, calibration, link)
            period: float | None = max(max(spans, key=spans.__getitem__), cover)
        else:
            period = _period(record, config, calibration, link)
        if period is None:
            continue
        at_period = predict(
            config["strategy"], config["workers"], calibration, link, period, config["servers"],
            config.get("fragments") or 1,
        )  # fmt: skip
        predicted = at_period.samples_per_second
        if spans:
            predicted = _over_spans(spans, cover, config, calibration, link)
        rate, samples = predicted, record.get("samples") or 0
        if samples:  # the loop's time at that speed, and the waits for worker 0's evaluations
            wait = evaluation_wait(config["strategy"], _evaluations(config, samples), calibration)
            predicted = samples / (samples / predicted + wait)
            # the run's samples/s also pays for what its loop does after the last step; the
            # time to target, reached before that, does not. A fixed period's phase places
            # its last exchange
            fixed = (config.get("tau_policy") or "fixed") == "fixed"
            steps = samples // config["workers"] // config["batch_size"] if fixed else None
            rate = samples / (samples / predicted + closing_seconds(at_period, steps))
        record["predicted_samples_per_second"] = rate
        measured = record.get("samples_per_second")
        if record["status"] == "ok" and measured:
            record["prediction_error"] = (rate - measured) / measured
        key = (record["task"], repeat)
        base = single.get((*key, record.get("link"))) or single.get((*key, None))
        reached = record.get("samples_to_target")
        # d as the bench sets it once every row is in, for rows predicted before that
        d = record.get("divergence") or (reached / base if base and reached else None)
        if base and d:
            ttt = time_to_target(predicted, base, d)
            record["predicted_time_to_target"] = ttt
            if record.get("time_to_target"):
                record["time_to_target_error"] = ttt / record["time_to_target"] - 1


def _as_ember(record: dict[str, Any]) -> dict[str, Any] | None:
    """The configuration to predict a row with: an ember row's own; a TorchDistributor row's
    as `allreduce`, since DDP's gradient all-reduce over gloo is the ring the model's
    allreduce is, a step at a time; None for the rest (MLlib)."""
    config = record.get("config") or {}
    if record.get("system") == "ember" or not config:
        return config or None
    if record.get("system") != "torch":
        return None
    fields = ("workers", "batch_size", "epochs", "eval_every")
    if any(config.get(name) is None for name in fields):
        return None
    return {
        **{name: config[name] for name in fields},
        "strategy": Strategy.ALLREDUCE.value,
        "servers": 1,
        "n_push": 1,
        "compress": "none",
    }


def _period(
    record: dict[str, Any], config: dict[str, Any], c: Calibration, link: Network
) -> float | None:
    """Minibatches between a row's exchanges: its n_push, or easgd's or diloco's tau. `--tau
    auto` and `--tau loss` move theirs as the run goes, so the period is the one the row ran
    at on average, read from the bytes it moved per sample (each exchange moves
    exchange_bytes for tau minibatches of one worker); before a row has run, `auto`'s is the
    one the model would pick on the row's link, and `loss`'s is unknown (None)."""
    if not Strategy(config["strategy"]).periodic:
        return float(config["n_push"])
    policy = config.get("tau_policy") or "fixed"
    moved = record.get("bytes_per_sample")
    if policy in ("auto", "loss") and moved:
        return c.exchange_bytes / (moved * config["batch_size"])
    if policy == "auto":
        return float(model_tau(c, link, config["workers"], config["servers"], AUTO_MARGIN))
    if policy == "loss":
        return None
    return float(config["tau"])


def _spans(record: dict[str, Any], config: dict[str, Any]) -> dict[int, int]:
    """Local steps run at each tau, over the workers, from the choices an adaptive row
    recorded (`tau_choices`: each worker's [step, tau]); {} without them. auto chooses a tau
    for the steps after `step`; loss records a period when it ends, so its tau held from
    `step - tau` (and the periods after it repeat it until the next record)."""
    choices = record.get("tau_choices") or {}
    samples = record.get("samples") or 0
    if not choices or not samples:
        return {}
    last = samples // config["workers"] // config["batch_size"]  # a worker's local steps
    ended = config.get("tau_policy") == "loss"
    spans: dict[int, int] = {}
    for chosen in choices.values():
        starts = ((int(s) - int(t) if ended and int(s) > 0 else int(s), int(t)) for s, t in chosen)
        ordered = sorted((max(0, step), tau) for step, tau in starts)
        ends = [step for step, _ in ordered[1:]] + [last]
        for (step, tau), end in zip(ordered, ends, strict=True):
            spans[tau] = spans.get(tau, 0) + max(0, min(end, last) - step)
    return spans


def _over_spans(
    spans: dict[int, int], cover: int, config: dict[str, Any], c: Calibration, link: Network
) -> float:
    """Samples/s of a run whose workers spent spans[tau] local steps in all at each tau, each
    span running at least `cover` steps a period (_cover): the workers' steps over the
    seconds each span takes at the model's speed for its period, times the workers running
    side by side."""
    workers, steps, seconds = config["workers"], sum(spans.values()), 0.0
    for tau, count in spans.items():
        period = max(tau, cover)
        rate = predict(config["strategy"], workers, c, link, period, config["servers"])
        seconds += count * workers * c.batch_size / rate.samples_per_second
    return workers * steps * c.batch_size / seconds if seconds > 0 else float("inf")


def _cover(config: dict[str, Any], c: Calibration, link: Network) -> int:
    """The fewest steps a period of the row's tau policy runs: an adaptive period puts off an
    exchange due while the last is in flight, so it runs at least as long as the exchange
    takes (algorithms/period.py) and compute never waits. auto records the tau it aims at,
    so its periods are covered by the model's; loss records each period as it ran, put-off
    steps included (1: nothing to add)."""
    if config.get("tau_policy") != "auto":
        return 1
    return model_tau(c, link, config["workers"], config["servers"])


def link_network(
    bandwidth: float, latency: float, cores: int | None, exchange: dict[str, Any] | None
) -> Network:
    """An emulated link as it measured: its rate, its one-way latency, and what the probe's
    exchange (bench/exchange_probe.py) took beyond the push and the reply at that rate and
    the latencies; its hosts share `cores`, and its token bucket passes BURST_BYTES at once."""
    link = Network(bandwidth=bandwidth, latency=latency, cores=cores, burst=BURST_BYTES)
    if not exchange:
        return link
    moved = exchange["bytes"]
    beyond = exchange["seconds"] - 2 * latency - 2 * link.transfer_seconds(moved / 2)
    kernel = exchange.get("kernel_cpu", 0.0)  # probes before it was measured: none
    if kernel > exchange["seconds"] * (cores or 1):
        # more CPU than the cores had in an exchange's time: a process that exited during
        # the probe, counted whole by probes before cpu_snapshot; not the kernel's
        kernel = 0.0
    measured = LinkExchange(
        max(0.0, beyond) / moved,
        exchange["client_cpu"] / moved,
        exchange["server_cpu"] / moved,
        kernel / moved,
    )
    return replace(link, exchange=measured)


def predict_results(
    records: list[dict[str, Any]], calibrations: dict[str, list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Predict a results file's rows again, with this model: the rows on this host as the
    local bench does, each link's rows at the rate and latency they measured (the median of
    its rows') and its probe's exchange, the hosts sharing the calibrating machine's cores.
    `calibrations` is settings.json's "calibration": {task: [one per repeat]}, each a
    Calibration's fields. Returns the records, predicted."""
    known = {f.name for f in fields(Calibration)}
    by_repeat: list[dict[str, Calibration]] = []
    for task, figures in calibrations.items():
        for repeat, given in enumerate(figures):
            while len(by_repeat) <= repeat:
                by_repeat.append({})
            by_repeat[repeat][task] = Calibration(**{k: v for k, v in given.items() if k in known})
    add_predictions([r for r in records if not r.get("link")], by_repeat)
    # the emulated hosts shared the cores of the machine that calibrated
    cores = max((c.cores for by_task in by_repeat for c in by_task.values()), default=None)
    for name in dict.fromkeys(r["link"] for r in records if r.get("link")):
        rows = [r for r in records if r.get("link") == name]
        rate = statistics.median(r["link_bytes_per_second"] for r in rows)
        latencies = [r["link_latency_seconds"] for r in rows if r.get("link_latency_seconds")]
        latency = statistics.median(latencies) if latencies else UNMEASURED_LATENCY
        exchange = next((r["link_exchange"] for r in rows if r.get("link_exchange")), None)
        network = link_network(rate, latency, cores, exchange)
        add_predictions(rows, by_repeat, network=network, among=records)
    return records


def _evaluations(config: dict[str, Any], samples: int) -> int:
    """How many times worker 0 evaluated in a row of `samples` samples in all, pausing its
    loop (deferred evaluations pause nothing)."""
    if config.get("eval_deferred"):
        return 0
    steps = samples // config["workers"] // config["batch_size"]
    per_epoch = max(1, steps // config["epochs"])
    return sum(evaluates_after(step, per_epoch, config["eval_every"]) for step in range(steps))
