"""The local PyTorch training loop of one worker, the same on every engine."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.numpy
import torch

from ember.algorithms import (
    FlatModel,
    ScheduledOptimizer,
    WorkerContext,
    local_optimizer,
    make_algorithm,
)
from ember.algorithms.period import Period
from ember.checkpoint import free_step, save_checkpoint
from ember.config import RunConfig
from ember.data import Dataset, shard_indices
from ember.data.batches import Batch, Inputs, MemoryBatches, ShardBatches
from ember.data.streamhost import StreamedDataset, counted, stream_batches
from ember.data.streaming import data_wait_fraction, stream_record
from ember.devicework import forward_precision, loss_scaler, on_device, placement, take
from ember.evaluation import ends_epoch, evaluate, evaluate_with, evaluates_after
from ember.metrics import (
    Divergence,
    Evaluation,
    TauChoice,
    WorkerDone,
    WorkerProgress,
    WorkerStart,
)
from ember.models import build_model
from ember.models.losses import make_loss, register_objects
from ember.spec import Layout, WorkerSpec, checkpoint_meta, load_data
from ember.wire import use_encryption

Report = Callable[[dict[str, Any]], None]


def make_model(config: RunConfig, dataset: Dataset) -> torch.nn.Module:
    return build_model(
        config.model, dataset.input_shape, dataset.num_classes, config.seed, probe=None
    )


CENTER_SOURCE = "center as of worker 0's latest exchange"
SNAPSHOT_BYTES = 256 << 20  # eval_deferred evaluates what it holds once past this


@dataclass(frozen=True)
class Snapshot:
    """Worker 0's parameters at an evaluation point, and that point's Evaluation fields
    (all but what evaluating them gives)."""

    params: np.ndarray
    point: dict[str, Any]


def run_worker(
    spec: WorkerSpec,
    report: Report,
    dataset: Dataset | None = None,
    stop: threading.Event | None = None,
) -> dict[str, Any]:
    """Train this worker's shard for the configured epochs, or until `stop` is set; leave the
    servers cleanly either way and return its totals."""
    use_encryption(spec.config.encrypt)  # this process's connections speak the run's transport
    config, worker = spec.config, Worker(spec, report, dataset)
    first_step, total_steps = worker.first_step, worker.total_steps
    steps_per_epoch = worker.steps_per_epoch
    # The loop runs here, not in a method: one frame less under a model that raises keeps the
    # traceback short enough for the engines' tail of the worker's log to show what it printed.
    worker.start()
    last_step = total_steps
    batches: Iterator[Batch] = iter(())
    for step in range(first_step, total_steps):
        if stop is not None and stop.is_set():
            last_step = step
            break
        epoch, index = divmod(step, steps_per_epoch)
        if index == 0 or step == first_step:  # a fresh order per epoch, fixed by the seed
            batches = worker.epoch_batches(epoch, index)
        worker.step(step, *next(batches))
        if (step + 1) % config.log_every == 0 or step + 1 == total_steps:
            worker.log(step, epoch)
        if spec.rank == 0 and evaluates_after(step, steps_per_epoch, config.eval_every):
            worker.evaluate(step, epoch)
        if worker.checkpoint_due(step + 1):
            worker.checkpoint(step + 1)
    done = worker.finish(last_step)
    worker.evaluate_snapshots()  # those eval_deferred kept, now that the clocks have stopped
    return done


class Worker:
    """One worker's training state and what run_worker does with it at each step."""

    def __init__(self, spec: WorkerSpec, report: Report, dataset: Dataset | None = None) -> None:
        """Load the shard, build the model and connect, ready to start."""
        config = spec.config
        torch.set_num_threads(config.threads)
        self.spec, self.config, self.report = spec, config, report
        self.dataset = dataset = dataset or load_data(config)
        self.batches: ShardBatches = shard_batches(spec, dataset)
        self.steps_per_epoch = self.batches.rows // config.batch_size
        register_objects(config.model, spec.model_object, spec.functions)
        self.placement = placement(config, spec.rank, spec.world, spec.gpus)
        self.device = device = take(self.placement)
        self.model = make_model(config, dataset)
        if self.placement.cuda:  # parameters, buffers and so the optimizer's state
            self.model.to(device)
        self.autocast = forward_precision(config.precision, device)
        self.scaler = loss_scaler(config.precision, self.model, device)
        self.loss = make_loss(config.loss)
        self.judged = (config.loss, config.metrics)  # what evaluations measure
        self.shape = (tuple(dataset.input_shape), dataset.num_classes)  # saved with checkpoints
        self.flat = flat = FlatModel(self.model, flat_grads=config.mode.ships_gradients)
        if spec.initial is not None:
            flat.load(spec.initial)
        elif spec.initial_file is not None:
            flat.load(safetensors.numpy.load_file(spec.initial_file)["params"])
        self.total_steps = config.epochs * self.steps_per_epoch
        optimizer = None
        if config.mode.local_optimizer:
            optimizer = local_optimizer(flat, config, self.total_steps)
        context = WorkerContext(
            config,
            spec.rank,
            spec.world,
            spec.servers,
            spec.secret,
            spec.incarnation,
            spec.rendezvous,
            spec.store,
            exclusive_device=self.placement.exclusive,
        )
        self.algorithm = make_algorithm(context)
        self.first_step = max(self.algorithm.start(flat, optimizer), spec.initial_step)
        if isinstance(optimizer, ScheduledOptimizer):  # a resumed worker's schedule goes on
            optimizer.steps = self.first_step
        # easgd's exchange period; the other algorithms have none
        self.exchange_period: Period | None = getattr(self.algorithm, "period", None)
        period = self.exchange_period
        # a period that adapts is fed each step's compute seconds, and the loss if it asks
        self.period = period if period is not None and period.adaptive else None
        self.feeds_loss = self.period is not None and self.period.wants_loss
        self.t_comp = 0.0  # seconds of compute, without waits on the network
        # each step's loss since the last progress record, kept apart to name a NaN's step
        self.losses, self.logged_steps = torch.zeros(config.log_every, device=device), 0
        self.diverged = False  # a step's loss was NaN or infinite (said once)
        self.aside = 0.0  # seconds of evaluation and checkpointing inside the loop, not training
        self.snapshots: list[Snapshot] = []  # evaluation points not yet evaluated
        self.saved_step = self.first_step  # of the last local checkpoint
        self.started = self.last_log = self.last_checkpoint = 0.0  # perf_counter() times

    def start(self) -> None:
        """Report the start and set the clocks: training begins now."""
        spec = self.spec
        self.report(
            WorkerStart(
                rank=spec.rank,
                incarnation=spec.incarnation,
                first_step=self.first_step,
                total_steps=self.total_steps,
            ).to_json()
        )
        self.started = self.last_log = self.last_checkpoint = time.perf_counter()

    def epoch_batches(self, epoch: int, index: int) -> Iterator[Batch]:
        """Epoch `epoch`'s batches from its `index`-th, on the worker's device."""
        batches = self.batches.epoch(epoch, index)
        return batches if self.device.type == "cpu" else on_device(batches, self.device)

    def step(self, step: int, inputs: Inputs, targets: torch.Tensor) -> None:
        """One training step on a batch: the hot path."""
        algorithm = self.algorithm
        step_started, waited_before = time.perf_counter(), algorithm.stats.t_wait
        self.flat.zero_grad()
        with self.autocast:  # the loss itself in float32, as autocast leaves it
            # called here, not through losses.forward: one frame less under a model that raises
            outputs = self.model(**inputs) if isinstance(inputs, dict) else self.model(inputs)
        loss = self.loss(outputs.float(), targets)
        if self.scaler is None:
            loss.backward()
        else:  # 16-mixed: backward on the scaled loss, the gradients scaled back
            self.scaler.backward(loss)
            self.scaler.unscale()
        if self.feeds_loss:  # the loss trigger decides in after_backward
            self.period.add_loss(loss.item())  # type: ignore[union-attr]
        algorithm.after_backward(step)
        # Waiting on an exchange is communication time, not compute.
        seconds = time.perf_counter() - step_started - (algorithm.stats.t_wait - waited_before)
        self.t_comp += seconds
        self.losses[self.logged_steps] = loss.detach()
        self.logged_steps += 1
        if self.period is not None:
            self.period.add_step(seconds)
            if self.period.changes:
                self.report_tau(self.period)

    def report_tau(self, period: Period) -> None:
        """The periods chosen since the last report, one record each."""
        spec = self.spec
        for change in period.changes:
            self.report(
                TauChoice(
                    rank=spec.rank,
                    incarnation=spec.incarnation,
                    step=max(change.step, self.first_step),  # the start: where this one began
                    policy=period.policy,
                    reason=change.reason,
                    tau=change.tau,
                    previous=change.previous,
                    t_comp=change.t_comp,
                    t_comm=change.t_comm,
                    details=change.details,
                ).to_json()
            )
        period.changes.clear()

    def log(self, step: int, epoch: int) -> None:
        """Report the steps since the last progress record."""
        now, spec, batch_size = time.perf_counter(), self.spec, self.config.batch_size
        losses = self.losses[: self.logged_steps]
        loss = float(losses.sum()) / self.logged_steps
        if not math.isfinite(loss) and not self.diverged:
            self.report_divergence(step + 1 - self.logged_steps, losses)
        self.report(
            WorkerProgress(
                rank=spec.rank,
                incarnation=spec.incarnation,
                step=step + 1,
                epoch=epoch + 1,
                loss=loss,
                samples=(step + 1 - self.first_step) * batch_size,
                samples_per_second=self.logged_steps * batch_size / (now - self.last_log),
                t_comp=self.t_comp,
                comm=self.algorithm.stats.as_record(),
                data_wait_fraction=data_wait_fraction(self.batches),
            ).to_json()
        )
        self.last_log, self.logged_steps = now, 0

    def report_divergence(self, done: int, losses: torch.Tensor) -> None:
        """The first step since `done` steps whose loss in `losses` was not finite, once."""
        first = int(torch.nonzero(~torch.isfinite(losses))[0, 0])
        self.diverged = True
        self.report(
            Divergence(
                rank=self.spec.rank,
                incarnation=self.spec.incarnation,
                step=done + first + 1,
                epoch=(done + first) // self.steps_per_epoch + 1,
                loss=str(float(losses[first])),
            ).to_json()
        )

    def evaluate(self, step: int, epoch: int) -> None:
        """Worker 0 evaluates on the held-out set the model its strategy trains: its local
        parameters, or easgd's center as of its latest exchange (none yet: its own). With
        eval_deferred it only copies them, for evaluate_snapshots after training: the loop
        then never pauses, so no other worker runs ahead of the clock this one keeps."""
        aside_started = time.perf_counter()
        center = getattr(self.algorithm, "center", None)
        point = {
            "epoch": epoch + 1,
            "step": step + 1,
            "epoch_end": ends_epoch(step, self.steps_per_epoch),
            # training so far, for time and samples to a target: the loop's seconds
            # without evaluation and checkpoints, and every worker's samples alike
            "seconds": aside_started - self.started - self.aside,
            "samples": (step + 1 - self.first_step) * self.config.batch_size * self.spec.world,
            "source": "worker 0 local parameters" if center is None else CENTER_SOURCE,
            "test_rows": len(self.dataset.y_test),
        }
        if self.config.eval_deferred:
            self.flat.gather_buffers()
            params = self.flat.to_host() if center is None else center
            self.snapshots.append(Snapshot(params.copy(), point))
            if len(self.snapshots) * params.nbytes > SNAPSHOT_BYTES:
                self.evaluate_snapshots()
        else:
            x, y, judged = self.dataset.x_test, self.dataset.y_test, self.judged
            if center is None:
                self._report_evaluation(point, evaluate(self.model, x, y, *judged))
            else:
                self._report_evaluation(point, evaluate_with(self.flat, center, x, y, *judged))
        self.aside += time.perf_counter() - aside_started

    def evaluate_snapshots(self) -> None:
        """Evaluate the parameters copied at each evaluation point, in order, and report them."""
        x, y = self.dataset.x_test, self.dataset.y_test
        for snapshot in self.snapshots:
            scores = evaluate_with(self.flat, snapshot.params, x, y, *self.judged)
            self._report_evaluation(snapshot.point, scores)
        self.snapshots.clear()

    def _report_evaluation(self, point: dict[str, Any], scores: dict[str, float]) -> None:
        self.report(Evaluation(**point, scores=scores).to_json())

    def checkpoint_due(self, done: int) -> bool:
        """Whether worker 0 of a strategy without a server saves after `done` steps."""
        config, spec, saved_step = self.config, self.spec, self.saved_step
        return (
            not config.uses_server
            and spec.rank == 0
            and (
                time.perf_counter() - self.last_checkpoint > config.checkpoint_seconds
                or (config.checkpoint_steps > 0 and done - saved_step >= config.checkpoint_steps)
            )
        )

    def checkpoint(self, step: int) -> None:
        """Save the local parameters as of `step`; the time goes aside, not to training."""
        aside_started = time.perf_counter()
        _save_local(self.spec, self.flat, step, self.shape)
        self.last_checkpoint, self.saved_step = time.perf_counter(), step
        self.aside += self.last_checkpoint - aside_started

    def finish(self, last_step: int) -> dict[str, Any]:
        """Leave the servers, save what a strategy without a server has not, and total up."""
        spec, config = self.spec, self.config
        self.algorithm.finish()
        period = self.exchange_period
        if self.period is not None and self.period.changes:  # chosen at the final exchange
            self.report_tau(self.period)
        seconds = time.perf_counter() - self.started - self.aside
        if not config.uses_server and spec.rank == 0 and self.saved_step != last_step:
            _save_local(spec, self.flat, last_step, self.shape)
        steps_run = last_step - self.first_step
        return WorkerDone(
            rank=spec.rank,
            incarnation=spec.incarnation,
            steps=steps_run,
            samples=steps_run * config.batch_size,
            seconds=seconds,
            aside_seconds=self.aside,
            t_comp=self.t_comp,
            comm=self.algorithm.stats.as_record(),
            tau=period.summary() if period is not None else {},
            data=stream_record(self.batches),
            device=self.placement.device,
            gpu=self.placement.gpu,
        ).to_json()


def shard_batches(spec: WorkerSpec, dataset: Dataset) -> ShardBatches:
    """This worker's training rows as batches, at least one batch of them: its own rows in
    place (a mapped shard stays mapped, never copied), else a copy of its shard."""
    if isinstance(dataset, StreamedDataset):  # its training rows stay on disk
        return stream_batches(dataset, spec.rank, spec.world, spec.config)
    x, y = dataset.x_train, dataset.y_train
    if not spec.own_rows:
        rows = shard_indices(len(x), spec.rank, spec.world)
        x, y = x[rows[0] : rows[-1] + 1], y[rows[0] : rows[-1] + 1]
    if len(y) < spec.config.batch_size:
        raise ValueError(
            f"worker {spec.rank}: shard of {len(y)} rows is smaller than one "
            f"batch of {spec.config.batch_size}"
        )
    return counted(MemoryBatches(x, y, spec.config.batch_size, spec.config.seed, spec.rank))


def _save_local(
    spec: WorkerSpec, flat: FlatModel, step: int, shape: tuple[tuple[int, ...], int]
) -> None:
    """Strategies without a server checkpoint worker 0's parameters (all workers agree)."""
    root = Path(spec.run_dir) / "checkpoints"
    flat.gather_buffers()
    save_checkpoint(
        root,
        free_step(root, step),  # never collides with checkpoints a fallen-back resume left
        {"params": flat.to_host().copy()},
        checkpoint_meta(spec.config, Layout(flat.param_size, flat.buffer_size), step, shape),
        keep=spec.config.keep_checkpoints,
    )
