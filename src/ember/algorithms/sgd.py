"""`sgd`: workers push gradients every n_push steps and pull parameters every n_fetch steps;
the server's optimizer applies them (synchronous SGD under BSP, Downpour under async)."""

from __future__ import annotations

import time

import torch

from ember.algorithms.base import CommStats, Optimizer, WorkerContext
from ember.algorithms.flat import FlatModel
from ember.ps import PSClient


class BufferChanges:
    """What a worker pushes of its buffers (BatchNorm statistics): how they changed since it
    last pushed, which the servers add in (rules.py). Changes, not values, so that a round of
    fresh pulls ends at the workers' mean and error feedback under --compress stays exact.

    A compressed pull adds the server's difference from what it believes this worker holds
    (compress.py's view), so before a pull the buffer keys are set back to the last pulled
    values; changes not yet pushed are kept aside and put back on top of the pulled ones."""

    def __init__(self, flat: FlatModel) -> None:
        self.flat = flat
        self.base = flat.buffers.clone()  # the buffers as last pushed or pulled
        self.pulled = flat.buffers.clone()  # as last pulled: what the servers' view holds
        self.unsent = torch.zeros_like(self.base)

    def stage(self, payload: torch.Tensor) -> None:
        """Write the changes since the last push into the buffer keys of `payload`."""
        flat = self.flat
        flat.gather_buffers()
        torch.sub(flat.buffers, self.base, out=payload[flat.param_size :])
        self.base.copy_(flat.buffers)

    def before_pull(self) -> None:
        flat = self.flat
        flat.gather_buffers()
        torch.sub(flat.buffers, self.base, out=self.unsent)
        # the host vector's buffer keys hold the last pull already: the pull lands on them
        flat.buffers.copy_(self.pulled)

    def after_pull(self) -> None:
        flat = self.flat  # from_host has brought the pull to the device
        self.pulled.copy_(flat.buffers)
        self.base.copy_(flat.buffers)
        flat.buffers.add_(self.unsent)
        flat.scatter_buffers()


class ServerSGD:
    def __init__(self, context: WorkerContext) -> None:
        self.context = context
        self.stats = CommStats()
        self.client: PSClient | None = None
        self.flat: FlatModel | None = None
        self.accumulated: torch.Tensor | None = None  # gradients summed since the last push
        self.pending = 0  # steps whose gradients `accumulated` holds
        self.buffers: BufferChanges | None = None  # None for a model without buffers

    def start(self, flat: FlatModel, optimizer: Optimizer | None) -> int:
        ctx = self.context
        self.flat = flat
        self.client = ctx.client()
        resumed = self.client.register()
        self.client.pull(flat.params_np)  # the first pull is whole, at full precision
        flat.from_host()
        flat.scatter_buffers()
        self.buffers = BufferChanges(flat) if flat.buffer_size else None
        if ctx.strategy.n_push > 1:
            self.accumulated = torch.zeros_like(flat.grads)
        self.run_step = resumed["run_step"]  # where a joiner's schedule starts
        return resumed["step"]

    def after_backward(self, step: int) -> None:
        assert self.client is not None and self.flat is not None
        strategy, flat = self.context.strategy, self.flat
        self.client.step = step + 1
        push_now = (step + 1) % strategy.n_push == 0
        pull_now = (step + 1) % strategy.n_fetch == 0
        if self.accumulated is not None:
            self.accumulated.add_(flat.grads)
            self.pending += 1
        if push_now:
            self._push(pull_now)
        elif pull_now:
            if self.buffers is not None:
                self.buffers.before_pull()
            started = time.perf_counter()
            self.stats.record(self.client.pull(flat.params_np), time.perf_counter() - started)
            flat.from_host()
            if self.buffers is not None:
                self.buffers.after_pull()

    def _push(self, pull: bool) -> None:
        """Push this step's gradient, or the mean of the accumulated ones, with the changes
        of the worker's buffers in their keys; pull if asked."""
        assert self.client is not None and self.flat is not None
        payload = self.flat.grads
        if self.accumulated is not None:
            payload = self.accumulated.div_(self.pending)
        if self.buffers is not None:
            self.buffers.stage(payload)
            if pull:
                self.buffers.before_pull()
        started = time.perf_counter()
        gradients = self.flat.host_grads(payload)
        result = self.client.push(gradients, self.flat.params_np if pull else None, pull=pull)
        self.stats.record(result, time.perf_counter() - started)
        if pull:
            self.flat.from_host()
        if pull and self.buffers is not None:
            self.buffers.after_pull()
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
