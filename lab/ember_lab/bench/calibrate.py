"""The short local runs `ember plan` and `ember bench` feed the throughput model: the time and
CPU of one parameter exchange alone, one evaluation of the test set, the codecs' seconds per
float, and short runs of the local engine (ember's own loop, launcher and watch loop) timing
a few hundred minibatches for single, and for async, bsp, ssp, easgd-async and allreduce with
two workers sharing this host's cores."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import psutil
import torch

from ember.config import RunConfig, Strategy
from ember.errors import EmberError
from ember.metrics import read_records
from ember.metrics.records import Record, WorkerDone, WorkerProgress
from ember.probe import (
    CODECS,
    Dataset,
    LocalEngine,
    ParsedRun,
    PSClient,
    ServerGroup,
    codec_named,
    evaluate,
    flatten_parameters,
    make_model,
    placement,
    take,
)
from ember_lab.perfmodel import CALIBRATION_TAU, Calibration

WARM_STEPS = 50  # minibatches per worker before the loop is measured
# Minibatches per worker measured, at least: a second or more of the loop, since a shorter
# window on a busy two-core host lands 30% either side of the loop's usual speed.
LOOP_STEPS = 800
QUICK_LOOP_STEPS = 200  # a smoke run's (`ember bench --quick`): figures, not good ones
# Rows a worker draws its minibatches from, at least: a full run gathers each minibatch from its
# whole shard, and a slice small enough to sit in the CPU's caches would time it too kindly.
WORKING_SET_BYTES = 128 * 2**20
EXCHANGES = 100  # timed round trips: CPU times tick in 10 ms steps, so take many
EVALUATIONS = 3  # timed evaluations of the test set
CODINGS = 9  # timed encodings and decodings of the parameters per codec


def calibrate(config: RunConfig, dataset: Dataset, loop_steps: int = LOOP_STEPS) -> Calibration:
    """Measure on this machine, one torch thread, for `config.model` on `config.data`, its
    minibatches on the device and in the precision a run of `config` computes in; each loop
    figure over `loop_steps` minibatches a worker."""
    torch.set_num_threads(1)
    where = placement(config.device, 0, 1, None)  # as a local run's worker 0 takes it
    model = make_model(config.model, config.seed, dataset)
    params = flatten_parameters(model)
    if where.cuda:
        model.to(take(where))
    t_eval = _evaluation_seconds(model, dataset)
    wall, client_cpu, server_cpu = exchange_figures(config, params)
    t_comp, _ = _loop_figures(config, dataset, Strategy.SINGLE, loop_steps)
    strategies = (
        Strategy.ASYNC,
        Strategy.BSP,
        Strategy.SSP,
        Strategy.EASGD_ASYNC,
        Strategy.ALLREDUCE,
    )
    on_host = {s.value: _loop_figures(config, dataset, s, loop_steps) for s in strategies}
    return Calibration(
        batch_size=config.batch_size,
        t_comp=t_comp,
        parameters=int(params.size),
        exchange_wall=wall,
        client_cpu=client_cpu,
        server_cpu=server_cpu,
        cores=os.cpu_count() or 1,
        on_host=on_host,
        t_eval=t_eval,
        codecs=codec_figures(params),
        device=where.device,
        precision=config.precision,
    )


def _evaluation_seconds(model: torch.nn.Module, dataset: Dataset) -> float:
    """Median seconds of one evaluation of the whole test set, as worker 0 runs it."""
    evaluate(model, dataset.x_test, dataset.y_test)  # warm-up: first-call allocations
    seconds = []
    for _ in range(EVALUATIONS):
        started = time.perf_counter()
        evaluate(model, dataset.x_test, dataset.y_test)
        seconds.append(time.perf_counter() - started)
    return float(np.median(seconds))


def codec_figures(params: np.ndarray) -> dict[str, tuple[float, float]]:
    """(encode, decode) seconds per float of every codec, on a vector the size of the model's
    parameters: the median of CODINGS each, after one of each to warm up."""
    rng = np.random.default_rng(0)
    # what the worker sends: small differences, as EASGD's and error feedback's are
    values = (rng.standard_normal(params.size) * 1e-3).astype(np.float32)
    decoded = np.empty_like(values)
    figures = {}
    for kind in CODECS:
        if kind == "none":
            continue
        codec = codec_named(kind)
        encoded = codec.encode(values)
        seconds: dict[str, list[float]] = {"encode": [], "decode": []}
        for _ in range(CODINGS + 1):
            started = time.perf_counter()
            codec.encode(values, encoded)
            between = time.perf_counter()
            codec.decode(encoded, decoded)
            seconds["encode"].append(between - started)
            seconds["decode"].append(time.perf_counter() - between)
        encoding, decoding = (float(np.median(seconds[k][1:])) for k in ("encode", "decode"))
        figures[kind] = (encoding / max(1, values.size), decoding / max(1, values.size))
    return figures


def exchange_figures(
    config: RunConfig, params: np.ndarray, exchanges: int = EXCHANGES
) -> tuple[float, float, float]:
    """(wall, client CPU, server CPU) seconds per push + pull through a real server process,
    over `exchanges` of them, with this process's wire settings."""
    probe = RunConfig(**{**config.to_dict(), "strategy": "async", "workers": 1, "servers": 1})
    secret = os.urandom(32)
    with tempfile.TemporaryDirectory(prefix="ember-calibrate-") as tmp:
        group = ServerGroup(probe, params, secret, Path(tmp))
        try:
            addresses = group.start()
            client = PSClient(addresses, secret, worker=0, timeout=probe.request_timeout)
            try:
                client.register()
                grad = np.zeros_like(params)  # a zero gradient leaves the parameters alone
                reply = np.empty_like(params)
                for _ in range(3):
                    client.push(grad, reply_into=reply, pull=True)
                server = psutil.Process(group.processes[0].pid)
                server_before = cpu_seconds(server)
                cpu_before, walls = time.process_time(), []
                for _ in range(exchanges):
                    walls.append(client.push(grad, reply_into=reply, pull=True).seconds)
                wall = float(np.median(walls))  # the machine's hiccups stay out of the figure
                client_cpu = (time.process_time() - cpu_before) / exchanges
                server_cpu = (cpu_seconds(server) - server_before) / exchanges
                client.done()
            finally:
                client.close()
        finally:
            group.stop()
    return wall, client_cpu, min(server_cpu, wall)


def cpu_seconds(process: psutil.Process) -> float:
    """CPU seconds `process` ran, to the nanosecond where Linux says (each thread's
    schedstat): its utime and stime count whole clock ticks, 10 ms, more than a few small
    exchanges cost a server."""
    try:
        tasks = list(Path(f"/proc/{process.pid}/task").iterdir())
    except OSError:  # not Linux
        return float(sum(process.cpu_times()[:2]))
    nanoseconds = 0
    for task in tasks:
        with contextlib.suppress(OSError, ValueError, IndexError):  # a thread that ended
            nanoseconds += int((task / "schedstat").read_text().split()[0])
    return nanoseconds / 1e9


def _calibration_rows(dataset: Dataset, batch_size: int, workers: int, steps: int) -> int:
    row_bytes = max(1, dataset.x_train[:1].nbytes)
    wanted = max((WARM_STEPS + steps) * batch_size * workers, WORKING_SET_BYTES // row_bytes)
    return min(len(dataset.x_train), wanted)


def _loop_figures(
    config: RunConfig, dataset: Dataset, strategy: Strategy, steps: int
) -> tuple[float, float]:
    """(seconds per minibatch, seconds blocked per exchange) of ember's own worker loop running
    `strategy` on this host (two workers, and a server if it uses one): a run of the local
    engine, its launcher and watch loop as `ember train`'s, over as many passes of the
    calibration rows as `steps` takes, measured after WARM_STEPS minibatches each (those
    include connecting and waiting for the peer). A worker that dies ends it: no restarts."""
    workers = 1 if strategy is Strategy.SINGLE else 2
    rows = _calibration_rows(dataset, config.batch_size, workers, steps)
    per_pass = max(1, rows // workers // config.batch_size)
    epochs = -(-(WARM_STEPS + steps) // per_pass)
    warm_steps = max(1, min(WARM_STEPS, epochs * per_pass // 4))
    cut = replace(
        dataset,
        x_train=dataset.x_train[:rows],
        y_train=dataset.y_train[:rows],
        x_test=dataset.x_test[:100],  # worker 0's end-of-epoch evaluation is not measured
        y_test=dataset.y_test[:100],
    )
    with tempfile.TemporaryDirectory(prefix="ember-calibrate-") as tmp:
        probe = RunConfig(
            **{
                **config.to_dict(),
                "strategy": strategy.value,
                "workers": workers,
                "tau": CALIBRATION_TAU,
                "tau_policy": "fixed",
                "epochs": epochs,
                "log_every": warm_steps,
                "eval_every": 0,
                "checkpoint_seconds": 3600.0,
                "engine": "local",
                "master": None,
                "out": tmp,
                "resume": None,
                "max_restarts": 0,
                "tensorboard": False,
                "mlflow": False,
            }
        )
        try:
            run = ParsedRun(probe, dataset=cut, show_progress=False)
            result = run.execute(LocalEngine())
        except EmberError as exc:
            raise EmberError(f"calibrating {strategy}: {exc}") from exc
        records = read_records(result.run_dir / "metrics.jsonl")
    return _loop_measured(records, workers, warm_steps, strategy)


def _loop_measured(
    records: list[Record], workers: int, warm_steps: int, strategy: Strategy
) -> tuple[float, float]:
    """The figures of a calibration run's records: each worker's progress at `warm_steps`
    and its totals, the steps between them timed."""
    warm = {
        r.rank: r.flat() for r in records if isinstance(r, WorkerProgress) and r.step == warm_steps
    }
    done = {r.rank: r.flat() for r in records if isinstance(r, WorkerDone)}
    if len(warm) < workers or len(done) < workers:
        raise EmberError(f"calibrating {strategy}: a worker did not report its figures")
    steps = exchanges = 0
    compute = blocked = 0.0
    for rank in range(workers):
        before, after = warm[rank], done[rank]
        waited = after["t_wait"] - before["t_wait"]
        # A step costs more than its timed compute: batching, bookkeeping, the loop itself.
        # A run's samples/s counts all of it, so the model's compute time does too: the
        # loop's time (without evaluations and checkpoints) less what it spent blocked.
        looped = after["seconds"] - before["seconds"]
        compute += max(after["t_comp"] - before["t_comp"], looped - waited)
        blocked += waited
        steps += after["steps"] - warm_steps
        exchanges += after["exchanges"] - before["exchanges"]
    return compute / steps, blocked / exchanges if exchanges else 0.0
