"""Every worker's training, the same on every engine: ember.run's function or ember train's
built-in loop, which is a train function over the same ember.Optimizer and worker context."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ember.algorithms import FlatModel, local_optimizer
from ember.checkpoint import free_step, save_checkpoint
from ember.config.objects import NO_OBJECTS, UserObjects
from ember.config.training import Schedule
from ember.data import Dataset
from ember.data.batches import Batch, Inputs
from ember.data.streaming import data_wait_fraction
from ember.metrics.records import Divergence, Evaluation, Record, WorkerDone, WorkerProgress
from ember.models import build_model
from ember.models.losses import make_loss
from ember.wire import use_encryption, use_wire_lanes
from ember.worker.device import forward_precision, loss_scaler, on_device
from ember.worker.evaluation import ends_epoch, evaluate, evaluate_with, evaluates_after
from ember.worker.spec import Layout, WorkerSpec, checkpoint_meta
from ember.worker.torchrun import torchrun_environment
from ember.worker.userloop import LoopContext, Optimizer, context, returned, worker_context

Report = Callable[[Record], None]


def make_model(
    model: str, seed: int, dataset: Dataset, objects: UserObjects = NO_OBJECTS
) -> torch.nn.Module:
    """The run's `model` (a name, a factory or the label of an object in `objects`) for
    `dataset`, its initialisation seeded by `seed`."""
    source = objects.model_for(model)
    shape, classes = dataset.input_shape, dataset.num_classes
    return build_model(model, shape, classes, seed, probe=None, source=source)


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
) -> WorkerDone:
    """Run this worker's function (ember.run's, else the built-in loop) with its context set,
    until it returns or `stop` is set; leave the servers cleanly either way, send rank 0's
    return value under ember.run (encoded, or why it cannot be) and return the totals."""
    parts = spec.parts
    # this process's connections speak the run's transport
    use_encryption(parts.servers.encrypt, parts.servers.wire_cipher)
    use_wire_lanes(parts.servers.wire_lanes)
    torch.set_num_threads(parts.training.threads)
    function, args = spec.train_fn or builtin_loop, spec.train_args
    with worker_context(spec, report, dataset, stop) as ctx:
        if spec.train_fn is None:
            value = function(*args)
        else:
            with torchrun_environment(spec, ctx.placement):
                value = function(*args)
    if spec.train_fn is not None and spec.rank == 0:
        save_loop_model(ctx)
        report(returned(value))
    return ctx.done()


def save_loop_model(ctx: LoopContext) -> None:
    """Under single and allreduce, rank 0's final parameters as the run's last checkpoint,
    where the run knows the model (model= given, trained through ember.Optimizer): the launcher
    exports them as model.safetensors, as the servers' are under the other strategies."""
    spec, optimizer = ctx.spec, ctx.optimizer
    known = spec.layout is not None and spec.layout.parameters > 0  # the layout of model=
    if spec.parts.strategy.uses_server or optimizer is None or not known:
        return
    dataset = ctx.dataset
    shape = (tuple(dataset.input_shape), dataset.num_classes)
    _save_local(spec, optimizer.flat, optimizer.steps, shape)


def builtin_loop() -> None:
    """ember train's training: the run's model, loss and optimizer over this worker's shard
    for the configured epochs, or until the engine asks it to stop."""
    ctx = context()
    loop = BuiltinLoop(ctx)
    if ctx.data.pieces is not None:
        dealt_loop(ctx, loop)
        return
    engine, optimizer = ctx.parts.engine, loop.optimizer
    first_step, total_steps = optimizer.steps, ctx.total_steps
    steps_per_epoch = ctx.data.steps_per_epoch
    last_step = total_steps
    batches: Iterator[Batch] = iter(())
    for step in range(first_step, total_steps):
        if ctx.stopped:
            last_step = step
            break
        epoch, index = divmod(step, steps_per_epoch)
        if index == 0 or step == first_step:  # a fresh order per epoch, fixed by the seed
            batches = loop.epoch_batches(epoch)
        loop.step(*next(batches))
        if (step + 1) % engine.log_every == 0 or step + 1 == total_steps:
            loop.log(step, epoch)
        if ctx.rank == 0 and evaluates_after(step, steps_per_epoch, engine.eval_every):
            loop.evaluate(step, epoch)
        if loop.checkpoint_due(step + 1):
            loop.checkpoint(step + 1)
    loop.finish(last_step)


def dealt_loop(ctx: LoopContext, loop: BuiltinLoop) -> None:
    """The built-in loop of a worker range's member: each epoch's pieces as the servers deal
    them, until none is left or the member is told to leave (it asks for no piece then)."""
    log_every, step = ctx.parts.engine.log_every, loop.optimizer.steps
    for epoch in range(ctx.epochs):
        batches, trained = loop.epoch_batches(epoch), 0
        # told to leave, a member goes once the piece it is in is trained
        while (
            not (ctx.stopped and ctx.data.between_pieces)
            and (batch := next(batches, None)) is not None
        ):
            loop.step(*batch)
            step, trained = step + 1, trained + 1
            if loop.logged_steps == log_every:
                loop.log(step - 1, epoch)
        batches.close()  # what it served is finished; a piece dealt ahead goes back
        if ctx.stopped:
            break
        if ctx.rank == 0 and trained:
            loop.evaluate(step - 1, epoch, epoch_end=True)
    if loop.logged_steps:
        loop.log(step - 1, ctx.epoch)
    loop.finish(step)


class BuiltinLoop:
    """The built-in loop's model, loss and optimizer, and what it does at each step."""

    def __init__(self, ctx: LoopContext) -> None:
        """Build the model and its ember.Optimizer: connected, ready to train."""
        spec, parts, dataset = ctx.spec, ctx.parts, ctx.dataset
        self.ctx, self.spec, self.parts, self.dataset = ctx, spec, parts, dataset
        training = parts.training
        self.steps_per_epoch = ctx.data.steps_per_epoch
        self.device = device = ctx.device
        objects = spec.objects
        self.model = make_model(training.model, parts.data.seed, dataset, objects)
        if ctx.placement.cuda:  # parameters, buffers and so the optimizer's state
            self.model.to(device)
        self.autocast = forward_precision(training.precision, device)
        self.scaler = loss_scaler(training.precision, self.model, device)
        self.loss = make_loss(training.loss, objects)
        self.judged = (training.loss, training.metrics, objects)  # what evaluations measure
        self.shape = (tuple(dataset.input_shape), dataset.num_classes)  # saved with checkpoints
        local = None  # bsp, ssp and async: the servers run the optimizer
        if parts.strategy.mode.local_optimizer:
            local = local_optimizer(self.model, training, ctx.schedule_steps, objects)
        self.optimizer = Optimizer(local, self.model)
        self.flat: FlatModel = self.optimizer.flat
        self.algorithm = self.optimizer.algorithm
        # each step's loss since the last progress record, kept apart to name a NaN's step
        self.losses, self.logged_steps = torch.zeros(parts.engine.log_every, device=device), 0
        self.diverged = False  # a step's loss was NaN or infinite (said once)
        self.snapshots: list[Snapshot] = []  # evaluation points not yet evaluated
        self.saved_step = self.optimizer.steps  # of the last local checkpoint
        self.last_log = self.last_checkpoint = ctx.started_at  # perf_counter() times

    def epoch_batches(self, epoch: int) -> Generator[Batch, None, None]:
        """Epoch `epoch`'s batches from where this worker stands, on the worker's device."""
        batches = self.ctx.data.batches(epoch)
        if self.device.type == "cpu":
            return batches
        # a range's pieces are served as trained: one read ahead would be one not trained
        return on_device(batches, self.device, ahead=self.ctx.data.pieces is None)

    def step(
        self, inputs: Inputs, targets: torch.Tensor, weights: torch.Tensor | None = None
    ) -> None:
        """One training step on a batch (its rows' `weights` where the run has a weight
        column): the hot path."""
        optimizer = self.optimizer
        optimizer.zero_grad()
        with self.autocast:  # the loss itself in float32, as autocast leaves it
            # called here, not through losses.forward: one frame less under a model that raises
            outputs = self.model(**inputs) if isinstance(inputs, dict) else self.model(inputs)
        loss = self.loss(outputs.float(), targets, weights)
        if self.scaler is None:
            loss.backward()
        else:  # 16-mixed: backward on the scaled loss, the gradients scaled back
            self.scaler.backward(loss)
            self.scaler.unscale()
        optimizer.step(loss.item() if optimizer.wants_loss else None)
        self.losses[self.logged_steps] = loss.detach()
        self.logged_steps += 1

    def log(self, step: int, epoch: int) -> None:
        """Report the steps since the last progress record."""
        now, spec, batch_size = time.perf_counter(), self.spec, self.parts.training.batch_size
        losses = self.losses[: self.logged_steps]
        loss = float(losses.sum()) / self.logged_steps
        if not math.isfinite(loss) and not self.diverged:
            self.report_divergence(step + 1 - self.logged_steps, losses)
        self.ctx.send(
            WorkerProgress(
                rank=spec.rank,
                incarnation=spec.incarnation,
                step=step + 1,
                epoch=epoch + 1,
                loss=loss,
                samples=(step + 1 - self.ctx.start_step) * batch_size,
                samples_per_second=self.logged_steps * batch_size / (now - self.last_log),
                t_comp=self.optimizer.t_comp,
                seconds=self.ctx.training_seconds(now),
                comm=self.algorithm.stats.as_record(),
                data_wait_fraction=data_wait_fraction(self.ctx.data.shard),
                lr=self.learning_rate(step),
            )
        )
        self.last_log, self.logged_steps = now, 0

    def learning_rate(self, step: int) -> float:
        """The rate the step ran at: the local optimizer's first group's, or under bsp, ssp
        and async the servers' schedule at that step (their clock advances with the steps)."""
        local = self.optimizer.optimizer
        groups = getattr(local, "param_groups", None) or getattr(
            getattr(local, "optimizer", None), "param_groups", None
        )
        if groups:
            return float(groups[0]["lr"])
        training = self.parts.training
        schedule = Schedule(training.scheduler, self.ctx.schedule_steps, training.warmup_steps)
        return training.lr * schedule.factor(step + self.optimizer.schedule_offset)

    def report_divergence(self, done: int, losses: torch.Tensor) -> None:
        """The first step since `done` steps whose loss in `losses` was not finite, once."""
        first = int(torch.nonzero(~torch.isfinite(losses))[0, 0])
        self.diverged = True
        self.ctx.send(
            Divergence(
                rank=self.spec.rank,
                incarnation=self.spec.incarnation,
                step=done + first + 1,
                epoch=(done + first) // self.steps_per_epoch + 1,
                loss=str(float(losses[first])),
            )
        )

    def evaluate(self, step: int, epoch: int, epoch_end: bool | None = None) -> None:
        """Worker 0 evaluates on the held-out set the model its strategy trains: its local
        parameters, or easgd's center as of its latest exchange (none yet: its own). With
        eval_deferred it only copies them, for evaluate_snapshots after training: the loop
        then never pauses, so no other worker runs ahead of the clock this one keeps."""
        aside_started = time.perf_counter()
        center = getattr(self.algorithm, "center", None)
        point = {
            "epoch": epoch + 1,
            "step": step + 1,
            "epoch_end": ends_epoch(step, self.steps_per_epoch) if epoch_end is None else epoch_end,
            # training so far, for time and samples to a target: the loop's seconds
            # without evaluation and checkpoints, and every worker's samples alike
            "seconds": self.ctx.training_seconds(aside_started),
            "samples": (step + 1 - self.ctx.start_step)
            * self.parts.training.batch_size
            * self.spec.world,
            "source": "worker 0 local parameters" if center is None else CENTER_SOURCE,
            "test_rows": len(self.dataset.y_test),
        }
        if self.parts.engine.eval_deferred:
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
        self.ctx.aside += time.perf_counter() - aside_started

    def evaluate_snapshots(self) -> None:
        """Evaluate the parameters copied at each evaluation point, in order, and report them."""
        x, y = self.dataset.x_test, self.dataset.y_test
        for snapshot in self.snapshots:
            scores = evaluate_with(self.flat, snapshot.params, x, y, *self.judged)
            self._report_evaluation(snapshot.point, scores)
        self.snapshots.clear()

    def _report_evaluation(self, point: dict[str, Any], scores: dict[str, float]) -> None:
        self.ctx.send(Evaluation(**point, scores=scores))

    def checkpoint_due(self, done: int) -> bool:
        """Whether worker 0 of a strategy without a server saves after `done` steps."""
        servers, spec, saved_step = self.parts.servers, self.spec, self.saved_step
        return (
            not self.parts.strategy.uses_server
            and spec.rank == 0
            and (
                time.perf_counter() - self.last_checkpoint > servers.checkpoint_seconds
                or (servers.checkpoint_steps > 0 and done - saved_step >= servers.checkpoint_steps)
            )
        )

    def checkpoint(self, step: int) -> None:
        """Save the local parameters as of `step`; the time goes aside, not to training."""
        aside_started = time.perf_counter()
        _save_local(self.spec, self.flat, step, self.shape)
        self.last_checkpoint, self.saved_step = time.perf_counter(), step
        self.ctx.aside += self.last_checkpoint - aside_started

    def finish(self, last_step: int) -> None:
        """Leave the servers, then save what a strategy without a server has not and evaluate
        what eval_deferred kept, now that the clocks have stopped: both set aside, as every
        checkpoint and evaluation is, so the training seconds end at the last exchange."""
        self.optimizer.finish()
        spec = self.spec
        if not self.parts.strategy.uses_server and spec.rank == 0 and self.saved_step != last_step:
            self.checkpoint(last_step)
        aside_started = time.perf_counter()
        self.evaluate_snapshots()
        self.ctx.aside += time.perf_counter() - aside_started


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
        checkpoint_meta(
            spec.config, Layout(flat.param_size, flat.buffer_size), step, shape, spec.objects
        ),
        keep=spec.parts.servers.keep_checkpoints,
    )
