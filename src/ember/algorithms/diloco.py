"""`diloco`: tau inner steps of the local optimizer, then the round's mean pseudo-gradient
through the servers' outer Nesterov step (Douillard et al. 2023); BSP over periods."""

from __future__ import annotations

import time

import numpy as np

from ember.algorithms.agreed import AgreedPeriod
from ember.algorithms.base import CommStats, Optimizer, WorkerContext
from ember.algorithms.flat import FlatModel
from ember.algorithms.period import Period
from ember.algorithms.streaming import StreamingDiLoCo, lerp
from ember.ps import PSClient


def make_diloco(context: WorkerContext) -> DiLoCo | StreamingDiLoCo:
    """Streaming DiLoCo with --fragments above 1, else DiLoCo's whole-model rounds."""
    return StreamingDiLoCo(context) if context.strategy.fragments > 1 else DiLoCo(context)


class DiLoCo:
    """Every tau local steps a worker pushes its pseudo-gradient, delta = x_start - x_now (the
    paper's sign: the outer step subtracts it, as an optimizer subtracts a gradient), and pulls
    the parameters the round's outer step made, which start its next period. The local
    optimizer's state stays on the worker across periods, as DiLoCo keeps its inner AdamW's.

    The whole flat vector travels, buffers included: the servers average the buffer keys
    (rules.py, DiLoCoRule.commit_buffers). With --compress the pseudo-gradient goes the way
    sgd's gradients go, encoded with error feedback, and the pull as the difference from the
    parameters this worker last pulled (compress.py).

    With --mixing-alpha a worker goes on from x_global + alpha (x_local - x_global) instead
    (torchft's mixing); its next period still counts from x_global."""

    def __init__(self, context: WorkerContext) -> None:
        self.context = context
        self.stats = CommStats()
        self.client: PSClient | None = None
        self.flat: FlatModel | None = None
        self.optimizer: Optimizer | None = None
        # a fixed tau, or under auto the one rank 0 names for all: rounds need every worker's
        tau = context.strategy.tau
        self.period = (
            AgreedPeriod(tau, context.rank == 0)
            if context.strategy.tau_policy == "auto"
            else Period(tau)
        )
        self.start_params = np.empty(0, np.float32)  # x_start: the period began here
        self.delta = np.empty(0, np.float32)  # the pseudo-gradient pushed
        self.mixing_alpha = context.strategy.mixing_alpha  # None: go on from the global ones
        self.steps_done: int | None = None  # local steps taken so far; None before the first
        self.exchanged_at: int | None = None  # local step of the latest exchange

    @property
    def center(self) -> np.ndarray | None:
        """What worker 0 evaluates: the global parameters as of its latest exchange (the
        model diloco trains; its own trail them by up to tau steps), None before one."""
        if self.context.rank != 0 or self.exchanged_at is None:
            return None
        return self.start_params

    def start(self, flat: FlatModel, optimizer: Optimizer | None) -> int:
        ctx = self.context
        self.flat, self.optimizer = flat, optimizer
        self.client = ctx.client()  # pseudo-gradients: error feedback, as gradients
        resumed = self.client.register()
        self.client.pull(flat.params_np)  # a (re)started worker begins from the global ones
        flat.from_host()
        flat.scatter_buffers()
        self.start_params = flat.params_np.copy()
        self.delta = np.empty_like(self.start_params)
        self.run_step = resumed["run_step"]  # where a joiner's schedule starts
        return resumed["step"]

    def after_backward(self, step: int) -> None:
        assert self.optimizer is not None
        self.optimizer.step()
        self.steps_done = step + 1
        if self.period.exchange_now(step + 1):
            self._exchange(step + 1, pull=True)

    def _exchange(self, step: int, pull: bool) -> None:
        assert self.client is not None and self.flat is not None
        flat, client = self.flat, self.client
        started = time.perf_counter()
        flat.gather_buffers()
        np.subtract(self.start_params, flat.to_host(), out=self.delta)
        client.step = step
        agreed = self.period if isinstance(self.period, AgreedPeriod) else None
        if agreed is not None:
            client.tau = agreed.proposal  # rank 0's, once decided; None for the others
        if pull:
            # A compressed pull adds the servers' difference to the parameters as last pulled,
            # so the vector holds those again before the reply lands in it.
            np.copyto(flat.params_np, self.start_params)
            result = client.push(self.delta, flat.params_np, pull=True)
            self._start_period(flat.params_np)
            flat.from_host()
            flat.scatter_buffers()
        else:
            result = client.push(self.delta)
        seconds = time.perf_counter() - started
        self.stats.record(result, seconds)
        self.exchanged_at = step
        if agreed is not None:
            agreed.exchanged(seconds)
            if result.tau is not None:
                agreed.follow(result.tau)

    def _start_period(self, pulled: np.ndarray) -> None:
        """The round's global parameters, in `pulled`, start the next period; with mixing the
        worker's own go on from the global ones moved alpha of the way to its local ones."""
        if self.mixing_alpha is None:
            np.copyto(self.start_params, pulled)
            return
        # the local parameters are x_start - delta: delta's room is free once it is pushed
        local = np.subtract(self.start_params, self.delta, out=self.delta)
        np.copyto(self.start_params, pulled)
        lerp(self.start_params, local, self.mixing_alpha, out=pulled)

    def finish(self) -> None:
        assert self.client is not None
        # The steps since the last exchange (all of them with fewer than tau) reach the
        # servers too, in a push without a pull: it waits for no round's result, only to be
        # folded, which happens once every live worker has reached its clock (a worker that
        # has left no longer counts), so it cannot deadlock a round.
        if self.steps_done is not None and self.steps_done != self.exchanged_at:
            self._exchange(self.steps_done, pull=False)
        self.client.done()
        self.client.close()
