"""A worker of `ember.run`: the user's function in place of the built-in loop, the context it
reads (`ember.context()`) and `ember.Optimizer`, which drives the run's algorithm from it."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ember.algorithms import FlatModel, WorkerContext, make_algorithm
from ember.algorithms.base import Algorithm, CommStats
from ember.algorithms.flat import flat_layout
from ember.config import RunConfig
from ember.data import Dataset, shard_indices
from ember.data.batches import Batch, MemoryBatches
from ember.devicework import placement, take
from ember.errors import ConfigError, EmberError
from ember.metrics import LoopProgress, WorkerDone, WorkerStart
from ember.returns import RETURNED, UnencodableValue, encode
from ember.spec import Layout, WorkerSpec, load_data
from ember.wire import use_encryption

# what every progress record holds already: a metric may not take one of these names
_RESERVED = frozenset(
    {"kind", "time", "reported", *LoopProgress.__dataclass_fields__, *CommStats().as_record()}
) - {"loss", "comm", "metrics"}

# what the algorithm is told of where this worker stands: WorkerSpec's fields of these names
_WHERE = ("rank", "world", "servers", "secret", "incarnation", "rendezvous", "store")
_current: LoopContext | None = None  # the context of the function this process runs
Report = Callable[[dict[str, Any]], None]  # where a worker's records go (its engine's)


def context() -> LoopContext:
    """The context of the worker running this function under ember.run."""
    if _current is None:
        raise EmberError(
            "ember.context() and ember.Optimizer are for the function ember.run runs on its"
            " workers; this process runs none"
        )
    return _current


def run_user_loop(
    spec: WorkerSpec, report: Report, dataset: Dataset | None = None
) -> dict[str, Any]:
    """Run spec.train_fn as this worker, leave the run cleanly when it returns, send rank 0's
    return value (encoded, or why it cannot be) and return the worker's totals."""
    global _current
    assert spec.train_fn is not None
    use_encryption(spec.config.encrypt)  # this process's connections speak the run's transport
    torch.set_num_threads(spec.config.threads)
    ctx = LoopContext(spec, report, dataset if dataset is not None else load_data(spec.config))
    _current = ctx
    try:
        value = spec.train_fn(*spec.train_args)
        if ctx.optimizer is not None:  # its last exchange, then it leaves the servers
            ctx.optimizer.finish()
    finally:
        _current = None
    if spec.rank == 0:
        report(returned(value))
    return ctx.done()


def returned(value: Any) -> dict[str, Any]:
    """The record carrying rank 0's return value, or the one line saying why it cannot: the
    launcher raises it once the run has ended, so a bad value costs no restart."""
    try:
        return {"kind": RETURNED, "rank": 0, "value": base64.b64encode(encode(value)).decode()}
    except UnencodableValue as exc:
        return {"kind": RETURNED, "rank": 0, "error": f"ember.run: {exc}"}


class WorkerData:
    """This worker's shard of the run's data: its rows (x, y), the held-out rows (x_test,
    y_test), and each epoch's minibatches in the built-in loop's seeded order."""

    def __init__(self, spec: WorkerSpec, dataset: Dataset, ctx: LoopContext) -> None:
        x, y = dataset.x_train, dataset.y_train
        if not spec.own_rows:  # the whole training set: this rank's rows of it
            rows = shard_indices(len(x), spec.rank, spec.world)
            x, y = x[rows[0] : rows[-1] + 1], y[rows[0] : rows[-1] + 1]
        config = spec.config
        if len(y) < config.batch_size:
            raise ValueError(
                f"worker {spec.rank}: shard of {len(y)} rows is smaller than one batch of"
                f" {config.batch_size}"
            )
        self.x, self.y = x, y
        self.x_test, self.y_test = dataset.x_test, dataset.y_test
        self.batch_size = config.batch_size
        self._batches = MemoryBatches(x, y, config.batch_size, config.seed, spec.rank)
        self.steps_per_epoch = len(y) // self.batch_size
        self._ctx = ctx

    def batches(self, epoch: int) -> Iterator[Batch]:
        """Epoch `epoch`'s (inputs, targets) minibatches, counted from 0. A restarted worker
        resumes from the servers' record of its steps, so batches it trained already are
        skipped and the loop goes on where the rank stopped."""
        ctx = self._ctx
        ctx.epoch = epoch
        start = min(max(0, ctx.start_step - epoch * self.steps_per_epoch), self.steps_per_epoch)
        for inputs, targets in self._batches.epoch(epoch, start):
            ctx.samples += len(targets)
            yield inputs, targets


class LoopContext:
    """Where this worker stands in ember.run: rank, world, its data, report(), and the steps
    its ember.Optimizer has taken."""

    def __init__(self, spec: WorkerSpec, report: Report, dataset: Dataset) -> None:
        self.spec, self.config = spec, spec.config
        self.rank, self.world, self.incarnation = spec.rank, spec.world, spec.incarnation
        self.epochs = spec.config.epochs  # the run's epochs
        self.epoch = 0  # of the batches served last, counted from 0
        self.samples = 0  # rows served by data.batches
        self.start_step = spec.initial_step  # where this incarnation began: the servers say
        self.optimizer: Optimizer | None = None
        self.placement = placement(self.config, spec.rank, spec.world, spec.gpus)
        self.device = take(self.placement)  # where the function's model and batches belong
        self.data = WorkerData(spec, dataset, self)
        self.total_steps = self.epochs * self.data.steps_per_epoch
        self._send = report
        self._started = time.perf_counter()
        self._last = (self._started, 0)  # time and samples of the previous report

    @property
    def step(self) -> int:
        """Optimizer steps this rank has taken, its earlier incarnations' included."""
        return self.optimizer.steps if self.optimizer is not None else self.start_step

    @property
    def start_epoch(self) -> int:
        """The epoch this incarnation begins in (0, or a restarted rank's): a loop over
        range(ctx.start_epoch, ctx.epochs) goes on where the rank stopped."""
        return self.start_step // self.data.steps_per_epoch

    @property
    def should_stop(self) -> bool:
        """Whether this rank has taken the run's steps: epochs times its shard's batches."""
        return self.step >= self.total_steps

    def report(self, **metrics: Any) -> None:
        """Numbers to the progress display, metrics.jsonl and TensorBoard; `loss` is the
        display's loss."""
        taken = sorted(_RESERVED & metrics.keys())
        if taken:
            raise ValueError(
                f"ctx.report: {', '.join(taken)} is a field of every progress record already;"
                " report it under another name"
            )
        values = {name: _number(name, value) for name, value in metrics.items()}
        now, samples = time.perf_counter(), self._served()
        seconds = now - self._last[0]
        self._send(
            LoopProgress(
                rank=self.rank,
                incarnation=self.incarnation,
                step=self.step,
                epoch=self.epoch + 1,
                loss=float(values.pop("loss", float("nan"))),
                samples=samples,
                samples_per_second=(samples - self._last[1]) / seconds if seconds > 0 else 0.0,
                t_comp=self._t_comp(now),
                comm=self._stats().as_record(),
                reported=tuple(metrics),
                metrics=values,
            ).to_json()
        )
        self._last = (now, samples)

    def started(self, optimizer: Optimizer) -> None:
        """The Optimizer is connected: training begins now, at `optimizer.steps`."""
        self.optimizer, self.start_step = optimizer, optimizer.steps
        self._started = time.perf_counter()
        self._last = (self._started, self.samples)
        self._send(
            WorkerStart(
                rank=self.rank,
                incarnation=self.incarnation,
                first_step=self.start_step,
                total_steps=self.total_steps,
            ).to_json()
        )

    def done(self) -> dict[str, Any]:
        now, steps = time.perf_counter(), self.step - self.start_step
        period = getattr(self.optimizer.algorithm, "period", None) if self.optimizer else None
        return WorkerDone(
            rank=self.rank,
            incarnation=self.incarnation,
            steps=steps,
            samples=self._served(),
            seconds=now - self._started,
            aside_seconds=0.0,
            t_comp=self._t_comp(now),
            comm=self._stats().as_record(),
            tau=period.summary() if period is not None else {},
            device=self.placement.device,
            gpu=self.placement.gpu,
        ).to_json()

    def _served(self) -> int:
        """Samples trained: the rows data.batches served, or for a loop that brings its own
        rows, a batch of the run's batch size per step."""
        return self.samples or (self.step - self.start_step) * self.config.batch_size

    def _stats(self) -> CommStats:
        return self.optimizer.algorithm.stats if self.optimizer is not None else CommStats()

    def _t_comp(self, now: float) -> float:
        return now - self._started - self._stats().t_wait


class Optimizer:
    """Wraps a torch.optim optimizer: step() does the local step and the run's exchange, as
    horovod's DistributedOptimizer does. Built inside ember.run's function, it connects and
    loads the run's parameters into `model` (a restarted worker's from the servers)."""

    def __init__(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> None:
        ctx = context()
        if ctx.optimizer is not None:
            raise EmberError("ember.Optimizer: this worker has one already; wrap one per worker")
        spec, config = ctx.spec, ctx.config
        if not config.mode.local_optimizer:  # bsp, ssp, async: the servers' optimizer steps
            check_server_optimizer(optimizer, config)
        self.optimizer, self.model = optimizer, model
        if config.uses_server and spec.layout is not None:
            check_layout(model, spec.layout)
        self.flat = flat = FlatModel(model, flat_grads=config.mode.ships_gradients)
        # each parameter's gradient is a view of flat.grads, which the exchange sends
        self._views = [(p, p.grad) for p in model.parameters() if p.grad is not None]
        where = {name: getattr(spec, name) for name in _WHERE}
        exclusive = ctx.placement.exclusive
        where_now = WorkerContext(config, **where, exclusive_device=exclusive)
        self.algorithm: Algorithm = make_algorithm(where_now)
        local = optimizer if config.mode.local_optimizer else None
        self.steps = max(self.algorithm.start(flat, local), spec.initial_step)
        self._finished = False
        ctx.started(self)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.flat.flat_grads:  # zeroed in place: None would cut .grad from flat.grads
            self.flat.zero_grad()
        else:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        """The gradients of this step are in place: the local step and the run's exchange."""
        if self.flat.flat_grads:
            self._regather()
        self.algorithm.after_backward(self.steps)
        self.steps += 1

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

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()


def check_server_optimizer(optimizer: Any, config: RunConfig) -> None:
    """Under bsp, ssp and async the servers apply every update with the run's optimizer: the
    one wrapped must be the same class with the same learning rate, or training would not be
    what the loop says."""
    name, lr = type(optimizer).__name__, optimizer.param_groups[0].get("lr")
    if name.lower() != config.optimizer.lower() or lr != config.lr:
        raise ConfigError(
            f"strategy {config.strategy!r} applies updates on the parameter servers with the"
            f" run's optimizer {config.optimizer!r} (lr {config.lr:g}), but ember.Optimizer"
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


__all__ = ["LoopContext", "Optimizer", "WorkerData", "context", "run_user_loop"]
