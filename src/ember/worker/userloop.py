"""What every worker's training function runs against, ember.run's and ember train's alike:
the worker context (`ember.context()`: rank, world, its shard, report) and `ember.Optimizer`."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import safetensors.numpy
import torch

from ember.algorithms import FlatModel, ScheduledOptimizer, WorkerContext, make_algorithm
from ember.algorithms.base import Algorithm, CommStats
from ember.algorithms.flat import flat_layout
from ember.algorithms.period import Period
from ember.config import TrainingPart
from ember.data import Dataset
from ember.data.streaming import stream_record
from ember.errors import ConfigError, EmberError
from ember.metrics.records import (
    Record,
    Returned,
    TauChoice,
    WorkerDone,
    WorkerProgress,
    WorkerStart,
)
from ember.worker.data import WorkerData
from ember.worker.device import placement, take
from ember.worker.returns import UnencodableValue, encode
from ember.worker.spec import Layout, WorkerSpec, load_data

# what every progress record holds already: a metric may not take one of these names, but for
# the loss and the epoch, which a loop written for TorchDistributor reports as its own
_RESERVED = frozenset(
    {"kind", "time", "reported", *WorkerProgress.__dataclass_fields__, *CommStats().as_record()}
) - {"loss", "comm", "metrics", "epoch"}

# what the algorithm is told of where this worker stands: WorkerSpec's fields of these names
_WHERE = ("rank", "world", "servers", "secret", "incarnation", "rendezvous", "store")
_current: LoopContext | None = None  # the context of the function this process runs
Report = Callable[[Record], None]  # where a worker's records go (its engine's)


def context() -> LoopContext:
    """The context of the worker running this function under ember.run."""
    if _current is None:
        raise EmberError(
            "ember.context() and ember.Optimizer are for the function ember.run runs on its"
            " workers; this process runs none"
        )
    return _current


@contextmanager
def worker_context(
    spec: WorkerSpec,
    report: Report,
    dataset: Dataset | None = None,
    stop: threading.Event | None = None,
) -> Iterator[LoopContext]:
    """This worker's context, what ember.context() returns while the block runs; leaving the
    block after the function returned, the Optimizer's last exchange and the run left."""
    global _current
    ctx = LoopContext(spec, report, dataset if dataset is not None else load_data(spec.parts))
    ctx.stop = stop
    _current = ctx
    try:
        yield ctx
        if ctx.optimizer is not None:
            ctx.optimizer.finish()
    finally:
        _current = None


def returned(value: Any) -> Returned:
    """The record carrying rank 0's return value, or the one line saying why it cannot: the
    launcher raises it once the run has ended, so a bad value costs no restart."""
    try:
        return Returned(value=base64.b64encode(encode(value)).decode())
    except UnencodableValue as exc:
        return Returned(error=f"ember.run: {exc}")


class LoopContext:
    """Where this worker stands: rank, world, its data, report(), the steps its
    ember.Optimizer has taken, and the seconds its loop set aside from training."""

    def __init__(self, spec: WorkerSpec, report: Report, dataset: Dataset) -> None:
        self.spec, self.parts = spec, spec.parts  # the parts of the run's config it reads
        self.rank, self.world, self.incarnation = spec.rank, spec.world, spec.incarnation
        self.epochs = self.parts.training.epochs  # the run's epochs
        self.epoch, self.samples = 0, 0  # of the batches served last (from 0); rows served
        self.start_step = spec.initial_step  # where this incarnation began: the servers say
        self.optimizer: Optimizer | None = None
        self.stop: threading.Event | None = None  # set: the engine asks the loop to end
        self.aside = 0.0  # seconds of evaluation and checkpoints inside the loop, not training
        self.dataset = dataset
        self.placement = placement(self.parts.training.device, spec.rank, spec.world, spec.gpus)
        self.device = take(self.placement)  # where the function's model and batches belong
        self.data = WorkerData(spec, dataset, self)
        self.total_steps = self.epochs * self.data.steps_per_epoch
        self.joiner = spec.schedule_epochs is not None  # it follows the run's schedule, then
        member_steps = max(1, self.data.shard.rows // spec.world // self.data.batch_size)
        self.schedule_steps = (spec.schedule_epochs or 0) * member_steps or self.total_steps
        self._send = report
        self.started_at = time.perf_counter()  # when training began: the Optimizer's start
        self._last = (self.started_at, 0)  # time and samples of the previous report

    @property
    def step(self) -> int:
        """Optimizer steps this rank has taken, its earlier incarnations' included."""
        return self.optimizer.steps if self.optimizer is not None else self.start_step

    @property
    def start_epoch(self) -> int:
        """The epoch this incarnation begins in: a restarted rank's (range(ctx.start_epoch,
        ctx.epochs) goes on where it stopped), else 0, as under a range (the servers deal)."""
        return 0 if self.data.pieces else self.start_step // self.data.steps_per_epoch

    @property
    def should_stop(self) -> bool:
        """Whether this rank has taken the run's steps (epochs times its shard's batches), or
        the engine asked it to leave the run (a range's member once its piece is trained)."""
        done = self.data.pieces is None and self.step >= self.total_steps
        return done or (self.stopped and self.data.between_pieces)

    @property
    def stopped(self) -> bool:
        """Whether the engine asked this worker to leave the run before its last step."""
        return self.stop is not None and self.stop.is_set()

    def training_seconds(self, now: float) -> float:
        """Seconds of training from the start to `now`, without those set aside."""
        return now - self.started_at - self.aside

    def report(self, **metrics: Any) -> None:
        """Numbers to the progress display, metrics.jsonl and TensorBoard; `loss` is the
        display's loss, and `epoch` (an integer) the record's epoch, as the loop counts it
        (else the epoch of the batches ctx.data served last, counted from 1)."""
        taken = sorted(_RESERVED & metrics.keys())
        if taken:
            raise ValueError(
                f"ctx.report: {', '.join(taken)} is a field of every progress record already;"
                " report it under another name"
            )
        epoch = metrics.pop("epoch", self.epoch + 1)
        if isinstance(epoch, bool) or not isinstance(epoch, int):
            raise ValueError(f"ctx.report: epoch must be an integer, got {epoch!r}")
        values = {name: _number(name, value) for name, value in metrics.items()}
        now, samples = time.perf_counter(), self._served()
        seconds = now - self._last[0]
        self._send(
            WorkerProgress(
                rank=self.rank,
                incarnation=self.incarnation,
                step=self.step,
                epoch=epoch,
                loss=float(values.pop("loss", float("nan"))),
                samples=samples,
                samples_per_second=(samples - self._last[1]) / seconds if seconds > 0 else 0.0,
                t_comp=self._t_comp(),
                comm=self._stats().as_record(),
                reported=tuple(metrics),
                metrics=values,
            )
        )
        self._last = (now, samples)

    def send(self, record: Record) -> None:
        """A record as ember's built-in loop writes it (progress, evaluation, divergence)."""
        self._send(record)

    def started(self, optimizer: Optimizer) -> None:
        """The Optimizer is connected: training begins now, at `optimizer.steps`."""
        self.optimizer, self.start_step = optimizer, optimizer.steps
        self.started_at = time.perf_counter()
        self._last = (self.started_at, self.samples)
        self._send(
            WorkerStart(
                rank=self.rank,
                incarnation=self.incarnation,
                first_step=self.start_step,
                total_steps=self.total_steps,
                schedule_step=optimizer.schedule_offset + optimizer.steps if self.joiner else None,
            )
        )

    def report_tau(self, period: Period) -> None:
        """The periods chosen since the last report, one record each."""
        for change in period.changes:
            self._send(
                TauChoice(
                    rank=self.rank,
                    incarnation=self.incarnation,
                    step=max(change.step, self.start_step),  # the start: where this one began
                    policy=period.policy,
                    reason=change.reason,
                    tau=change.tau,
                    previous=change.previous,
                    t_comp=change.t_comp,
                    t_comm=change.t_comm,
                    details=change.details,
                )
            )
        period.changes.clear()

    def done(self) -> WorkerDone:
        """This worker's totals, once its function has returned."""
        steps = self.step - self.start_step
        optimizer = self.optimizer
        period = optimizer.period if optimizer is not None else None
        return WorkerDone(
            rank=self.rank,
            incarnation=self.incarnation,
            steps=steps,
            samples=self._served(),
            seconds=self.training_seconds(time.perf_counter()),
            aside_seconds=self.aside,
            t_comp=self._t_comp(),
            comm=self._stats().as_record(),
            tau=period.summary() if period is not None else {},
            data=stream_record(self.data.shard),
            device=self.placement.device,
            gpu=self.placement.gpu,
            left=True if self.stopped and self.step < self.total_steps else None,
        )

    def _served(self) -> int:
        """Samples trained: the rows data.batches served, or a batch a step (own rows)."""
        return self.samples or (self.step - self.start_step) * self.parts.training.batch_size

    def _stats(self) -> CommStats:
        return self.optimizer.algorithm.stats if self.optimizer is not None else CommStats()

    def _t_comp(self) -> float:
        return self.optimizer.t_comp if self.optimizer is not None else 0.0


class Optimizer:
    """Wraps a torch.optim optimizer: step() does the local step and the run's exchange, as
    horovod's DistributedOptimizer does. Built inside the worker's function, it connects and
    loads the run's parameters into `model` (a restarted worker's from the servers). Under
    bsp, ssp and async the servers run the optimizer: `optimizer` may then be None."""

    def __init__(self, optimizer: Any, model: torch.nn.Module) -> None:
        ctx = context()
        if ctx.optimizer is not None:
            raise EmberError("ember.Optimizer: this worker has one already; wrap one per worker")
        spec, strategy = ctx.spec, ctx.parts.strategy
        if not strategy.mode.local_optimizer:  # bsp, ssp, async: the servers' optimizer steps
            if optimizer is not None:
                check_server_optimizer(optimizer, strategy.strategy, ctx.parts.training)
        elif optimizer is None:
            raise ConfigError(
                f"strategy {strategy.strategy!r} runs the optimizer on the workers: ember.Optimizer"
                " needs one to wrap"
            )
        self.optimizer, self.model = optimizer, model
        if strategy.uses_server and spec.layout is not None:
            check_layout(model, spec.layout)
        self.flat = flat = FlatModel(model, flat_grads=strategy.mode.ships_gradients)
        if spec.initial is not None:  # a resumed run's parameters, for a strategy without servers
            flat.load(spec.initial)
        elif spec.initial_file is not None:
            flat.load(safetensors.numpy.load_file(spec.initial_file)["params"])
        # each parameter's gradient is a view of flat.grads, which the exchange sends
        self._views = [(p, p.grad) for p in model.parameters() if p.grad is not None]
        where = {name: getattr(spec, name) for name in _WHERE}
        exclusive = ctx.placement.exclusive
        where_now = WorkerContext(ctx.parts, **where, exclusive_device=exclusive)
        self.algorithm: Algorithm = make_algorithm(where_now)
        local = optimizer if strategy.mode.local_optimizer else None
        self.steps = max(self.algorithm.start(flat, local), spec.initial_step)
        # A resumed worker's schedule goes on from its step; a joiner's from the run's
        # (the servers say where the run's own workers stand).
        # the schedule's step at this worker's step 0: a joiner's is where the run stands
        self.schedule_offset = getattr(self.algorithm, "run_step", 0) if ctx.joiner else 0
        if isinstance(optimizer, ScheduledOptimizer):
            optimizer.resume_at(self.steps + self.schedule_offset)
        # easgd's and diloco's exchange period (the others have none); one that adapts is fed
        # each step's compute seconds, and its loss if it asks
        self.period: Period | None = getattr(self.algorithm, "period", None)
        self._adapts = self.period if self.period is not None and self.period.adaptive else None
        # tau 'loss': step() wants each step's loss, which costs the loop a .item() sync
        self.wants_loss = self._adapts is not None and self._adapts.wants_loss
        self.t_comp = 0.0  # seconds of compute, without waits on the network
        self._zeroed = False  # zero_grad() kept .grad on flat.grads: nothing to regather
        self._finished = False
        self._ctx = ctx
        ctx.started(self)
        self._began = ctx.started_at  # this step's start: its zero_grad, else the last step's end

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._began = time.perf_counter()
        if self.flat.flat_grads:  # zeroed in place: None would cut .grad from flat.grads
            self.flat.zero_grad()
            self._zeroed = True
        else:
            self.model.zero_grad(set_to_none=set_to_none)

    def step(self, loss: float | None = None) -> None:
        """The gradients of this step are in place: the local step and the run's exchange.
        The built-in loop passes each step's `loss`, which tau 'loss' follows."""
        algorithm, adapts = self.algorithm, self._adapts
        waited = algorithm.stats.t_wait
        if self.flat.flat_grads and not self._zeroed:
            self._regather()
        if self.wants_loss and loss is not None:
            adapts.add_loss(loss)  # type: ignore[union-attr]
        algorithm.after_backward(self.steps)
        self.steps += 1
        # Waiting on an exchange is communication time, not compute.
        now = time.perf_counter()
        seconds = now - self._began - (algorithm.stats.t_wait - waited)
        self.t_comp += seconds
        self._began, self._zeroed = now, False
        if adapts is not None:
            adapts.add_step(seconds)
            if adapts.changes:
                self._ctx.report_tau(adapts)

    def _regather(self) -> None:
        """A loop that set .grad to None (model.zero_grad(), a torch optimizer's zero_grad)
        had autograd allocate fresh tensors: their values go back into flat.grads, which
        is what the exchange sends, and .grad views it again."""
        for param, view in self._views:
            grad = param.grad
            if grad is None or grad.data_ptr() != view.data_ptr():
                with torch.no_grad():
                    if grad is None:
                        view.zero_()
                    else:
                        view.copy_(grad)
                param.grad = view

    def finish(self) -> None:
        """The last exchange and leaving the run; once, when the function returns."""
        if not self._finished:
            self._finished = True
            self.algorithm.finish()
            if self.period is not None and self.period.changes:  # chosen at the final exchange
                self._ctx.report_tau(self.period)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups if self.optimizer is not None else []

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict() if self.optimizer is not None else {}


def check_server_optimizer(optimizer: Any, strategy: str, training: TrainingPart) -> None:
    """Under bsp, ssp and async the servers apply every update with the run's optimizer: the
    one wrapped must be the same class with the same learning rate, or training would not be
    what the loop says."""
    name, lr = type(optimizer).__name__, optimizer.param_groups[0].get("lr")
    if name.lower() != training.optimizer.lower() or lr != training.lr:
        raise ConfigError(
            f"strategy {strategy!r} applies updates on the parameter servers with the"
            f" run's optimizer {training.optimizer!r} (lr {training.lr:g}), but ember.Optimizer"
            f" wraps {name} (lr {lr:g}); pass ember.run optimizer={name.lower()!r} and"
            f" lr={lr:g}, or wrap the run's optimizer"
        )


def check_layout(model: torch.nn.Module, layout: Layout) -> None:
    """The servers hold the state of ember.run's model=: the loop's model must have as many
    parameters and buffer values, or nothing it pulls or pushes would fit."""
    parameters, buffers = flat_layout(model)
    if (parameters, buffers) != (layout.parameters, layout.buffers):
        raise ConfigError(
            f"ember.Optimizer's model has {parameters} parameters and {buffers} buffer values,"
            f" but the servers hold {layout.parameters} and {layout.buffers}, the state of"
            " ember.run's model=: pass the module train_fn trains (or a function building it)"
        )


def _number(name: str, value: Any) -> int | float:
    if isinstance(value, bool | int):
        return int(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"ctx.report: {name}={value!r} is not a number") from None


__all__ = [
    "LoopContext",
    "Optimizer",
    "context",
    "returned",
    "worker_context",
]
