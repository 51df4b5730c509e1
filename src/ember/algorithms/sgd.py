"""`sgd`: workers push gradients every n_push steps and pull parameters every n_fetch steps;
the server's optimizer applies them (synchronous SGD under BSP, Downpour under async)."""

from __future__ import annotations

import time

import torch

from ember.algorithms.base import CommStats, Optimizer, WorkerContext
from ember.algorithms.flat import FlatModel
from ember.ps import PSClient


class ServerSGD:
    def __init__(self, context: WorkerContext) -> None:
        self.context = context
        self.stats = CommStats()
        self.client: PSClient | None = None
        self.flat: FlatModel | None = None
        self.accumulated: torch.Tensor | None = None  # gradients summed since the last push
        self.pending = 0  # steps whose gradients `accumulated` holds

    def start(self, flat: FlatModel, optimizer: Optimizer | None) -> int:
        ctx = self.context
        self.flat = flat
        self.client = PSClient(
            ctx.servers,
            ctx.secret,
            worker=ctx.rank,
            incarnation=ctx.incarnation,
            timeout=ctx.config.request_timeout,
            compress=ctx.config.compress,
        )
        resumed = self.client.register()
        self.client.pull(flat.params_np)
        if ctx.config.n_push > 1:
            self.accumulated = torch.zeros_like(flat.grads)
        return resumed["step"]

    def after_backward(self, step: int) -> None:
        assert self.client is not None and self.flat is not None
        config, flat = self.context.config, self.flat
        self.client.step = step + 1
        push_now = (step + 1) % config.n_push == 0
        pull_now = (step + 1) % config.n_fetch == 0
        if self.accumulated is not None:
            self.accumulated.add_(flat.grads)
            self.pending += 1
        if push_now:
            self._push(pull_now)
        elif pull_now:
            started = time.perf_counter()
            self.stats.record(self.client.pull(flat.params_np), time.perf_counter() - started)

    def _push(self, pull: bool) -> None:
        """Push this step's gradient, or the mean of the accumulated ones; pull if asked."""
        assert self.client is not None and self.flat is not None
        payload = self.flat.grads
        if self.accumulated is not None:
            payload = self.accumulated.div_(self.pending)
        started = time.perf_counter()
        result = self.client.push(payload.numpy(), self.flat.params_np if pull else None, pull=pull)
        self.stats.record(result, time.perf_counter() - started)
        if self.accumulated is not None:
            self.accumulated.zero_()
            self.pending = 0

    def finish(self) -> None:
        if self.client is not None:
            # gradients of the last steps, fewer than n_push, still reach the parameters
            if self.pending:
                self._push(pull=False)
            self.client.done()
            self.client.close()
