"""A worker's device at work: the device it takes, the forward pass's precision (autocast, and
float16's gradient scaler), and batches moved to a GPU one step ahead. Nothing here touches
CUDA unless the worker's device is a GPU."""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterator, Sequence
from typing import Any

import torch

from ember.config.devices import Placement, cuda_count, needs_count, place_local, place_task
from ember.data.batches import Batch, Inputs


def placement(device: str, rank: int, world: int, gpus: Sequence[str] | None) -> Placement:
    """Worker `rank`'s device for the run's `device` (auto, cpu, cuda, cuda:N): on a local run
    by its rank (`gpus` None), on a Spark task from the GPU addresses Spark assigned it. CUDA
    is asked about only when the request may use it."""
    count = cuda_count() if needs_count(device, gpus) else 0
    if gpus is None:
        return place_local(device, rank, world, count)
    return place_task(device, gpus, count)


def take(where: Placement) -> torch.device:
    """The torch device of a placement, made this thread's current CUDA device when a GPU."""
    device = torch.device(where.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def forward_precision(
    precision: str, device: torch.device
) -> contextlib.AbstractContextManager[Any]:
    """The context a training step's forward pass runs in for `precision` on `device`."""
    if precision == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if precision == "16-mixed":
        return torch.autocast(device.type, dtype=torch.float16)
    return contextlib.nullcontext()


class LossScaler:
    """16-mixed's dynamic loss scale (torch.amp.GradScaler): the loss is scaled up before the
    backward pass so that float16 gradients do not underflow, and the gradients are scaled back
    down before the algorithm sees them. A step whose gradients overflowed is given zero
    gradients (and the scale halves) rather than skipped, so every worker's clock and exchange
    period stay where the other workers' are."""

    def __init__(self, module: torch.nn.Module, device: torch.device) -> None:
        self.scaler = torch.amp.GradScaler(device.type)
        self.params = [p for p in module.parameters() if p.requires_grad]
        # GradScaler unscales an optimizer's parameter groups; this one is never stepped
        self.groups = torch.optim.SGD(self.params, lr=0.0)
        self.overflows = 0  # steps whose scaled gradients were not finite

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def unscale(self) -> None:
        """The gradients in their own scale, or zero where they overflowed; the scale moves."""
        self.scaler.unscale_(self.groups)
        grads = [p.grad for p in self.params if p.grad is not None]
        if grads and not bool(torch.stack([g.isfinite().all() for g in grads]).all()):
            for grad in grads:
                grad.zero_()  # in place: a flat model's .grad views its gradient vector
            self.overflows += 1
        self.scaler.update()


def loss_scaler(precision: str, module: torch.nn.Module, device: torch.device) -> LossScaler | None:
    return LossScaler(module, device) if precision == "16-mixed" else None


def on_device(
    batches: Iterator[Batch], device: torch.device, ahead: bool = True
) -> Generator[Batch, None, None]:
    """`batches` on a GPU: each copied from pinned host memory without blocking, one step
    ahead (unless not `ahead`), so the copy of the next batch overlaps this step's compute."""
    held: Batch | None = None
    for inputs, *tensors in batches:  # targets, and weights where the run has them
        moved: Batch = (_moved(inputs, device), *(_moved(t, device) for t in tensors))
        if not ahead:
            yield moved
            continue
        if held is not None:
            yield held
        held = moved
    if held is not None:
        yield held


def _moved(value: Inputs, device: torch.device) -> Any:
    if isinstance(value, dict):
        return {name: _moved(tensor, device) for name, tensor in value.items()}
    # the pinned copy lives until the copy is done: torch's host allocator records its use
    return value.pin_memory().to(device, non_blocking=True)


def inputs_to(inputs: Any, device: torch.device) -> Any:
    """Evaluation's inputs on the model's device: as they are on the CPU."""
    if device.type == "cpu":
        return inputs
    if isinstance(inputs, dict):
        return {name: tensor.to(device) for name, tensor in inputs.items()}
    return inputs.to(device)
