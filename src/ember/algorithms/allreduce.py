"""`allreduce`: gradient all-reduce through torch.distributed, no server: Horovod/DDP. NCCL
between workers each on a GPU of its own, gloo otherwise (CPUs, or GPUs shared)."""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from ember.algorithms.base import CommStats, Optimizer, WorkerContext
from ember.algorithms.flat import FlatModel
from ember.ps import ExchangeResult

SETTLE_SECONDS = 0.05  # the GIL released before a process group goes (settled)


class AllReduceSGD:
    def __init__(self, context: WorkerContext) -> None:
        self.context = context
        self.stats = CommStats()
        self.flat: FlatModel | None = None
        self.optimizer: Optimizer | None = None

    def start(self, flat: FlatModel, optimizer: Optimizer | None) -> int:
        ctx = self.context
        self.flat, self.optimizer = flat, optimizer
        # a store the engine opened (Spark's tasks meet through allGather), else init_method
        meeting = {"store": ctx.store} if ctx.store is not None else {"init_method": ctx.rendezvous}
        # NCCL needs a GPU per rank; gloo all-reduces CUDA tensors too, through the host
        exclusive = flat.device.type == "cuda" and ctx.exclusive_device
        if not dist.is_initialized():  # else the loop's own init_process_group made the group
            dist.init_process_group(
                "nccl" if exclusive else "gloo",
                rank=ctx.rank,
                world_size=ctx.world,
                timeout=datetime.timedelta(seconds=ctx.request_timeout),
                **meeting,
            )
        flat.gather_buffers()
        dist.broadcast(flat.params, src=0)  # identical start, also after a resume
        flat.scatter_buffers()
        return 0

    def after_backward(self, step: int) -> None:
        assert self.flat is not None and self.optimizer is not None
        flat = self.flat
        started = time.perf_counter()
        # The buffers ride in the gradient vector's buffer keys, so one all-reduce averages
        # both: every worker's BatchNorm statistics count, as DDP's broadcast from rank 0
        # (which keeps only rank 0's) would not, and no second collective is paid for.
        flat.stage_buffers(flat.grads)
        dist.all_reduce(flat.grads, op=dist.ReduceOp.SUM)
        flat.grads.div_(self.context.world)
        if flat.buffer_size:
            flat.buffers.copy_(flat.grads[flat.param_size :])
            flat.scatter_buffers()
        elapsed = time.perf_counter() - started
        # A ring all-reduce sends and receives 2 (n - 1) / n of the buffer per worker.
        moved = int(2 * (self.context.world - 1) / self.context.world * flat.grads.nbytes)
        self.stats.record(ExchangeResult(elapsed, moved, moved, 0), elapsed)
        self.optimizer.step()

    def finish(self) -> None:
        if dist.is_initialized():
            settled(dist.destroy_process_group)()


def settled(destroy: Callable[..., None]) -> Callable[..., None]:
    """`destroy` (torch.distributed.destroy_process_group) once gloo's worker threads have
    settled. A collective launched inside backward() (DDP's) leaves the copy of backward's
    thread-local Python context in the gloo thread that ran it, which needs the GIL to drop it;
    a process group freed right after (the loop's return frees DDP's reducer and with it the
    group) joins those threads holding the GIL, and both wait for ever (torch 2.13, seen in
    Spark tasks). Releasing the GIL for a moment first lets the threads drop it."""

    def call(*args: Any, **kwargs: Any) -> None:
        time.sleep(SETTLE_SECONDS)
        destroy(*args, **kwargs)

    return call
