"""Where a worker computes: the device a run asks for, the one each worker takes, and whether
its exchange stages through host memory. Imports only errors; torch lazily, and only what
tells whether CUDA is there, never what initialises it (a forked Spark worker must not)."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ember.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda", "cuda:N")  # what --device takes
# Set to 1, a worker on the CPU stages its exchanges through a host copy of its parameters as
# a worker on a GPU does: the device path's bookkeeping, checked where there is no GPU.
STAGING_ENV = "EMBER_HOST_STAGING"
GPU_RESOURCE = "gpu"  # Spark's resource name for GPUs (spark.task.resource.gpu.amount)
SPARK_GPU_CONF = "spark.task.resource.gpu.amount=1 and spark.executor.resource.gpu.amount"


def check_device(device: str) -> None:
    """One of DEVICES, cuda:N with N a GPU index."""
    if device in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", device):
        return
    # no "did you mean": the nearest spelling of "gpu" is "cpu", the opposite of what it means
    raise ConfigError(f"device must be one of {', '.join(DEVICES)}; got {device!r}")


def cuda_count() -> int:
    """CUDA devices this process sees: 0 where torch was built without CUDA or none is there.
    torch.cuda.is_available() asks the driver without creating a CUDA context."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_available(device: str, count: int) -> None:
    """That a run on this machine can compute on `device` where `count` GPUs are visible."""
    if not device.startswith("cuda"):
        return
    if count == 0:
        raise ConfigError(
            f"device {device!r} needs CUDA, and torch sees no CUDA device on this machine"
            " (torch.cuda.is_available() is False); use --device cpu, or auto to take a GPU"
            " only where there is one"
        )
    index = _index(device)
    if index is not None and index >= count:
        raise ConfigError(
            f"device {device!r}: this machine has {count} CUDA device(s), numbered 0 to {count - 1}"
        )


@dataclass(frozen=True)
class Placement:
    """The device one worker computes on."""

    device: str  # "cpu" or "cuda:N"
    gpu: str | None = None  # the GPU address Spark assigned the task, used or not
    exclusive: bool = True  # no other worker of the run computes on this device

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")


def place_local(requested: str, rank: int, world: int, count: int) -> Placement:
    """A local run's worker `rank` of `world` where `count` GPUs are visible: auto and cuda
    give worker i GPU i mod count, so workers share GPUs when there are more of them."""
    if requested == "cpu" or (requested == "auto" and count == 0):
        return Placement("cpu")
    check_available(requested, count)
    index = _index(requested)
    if index is not None:  # every worker on the one GPU named
        return Placement(requested, exclusive=world == 1)
    return Placement(f"cuda:{rank % count}", exclusive=world <= count)


def place_task(requested: str, assigned: Sequence[str], count: int) -> Placement:
    """A Spark task's device from the GPU addresses Spark assigned it (TaskContext.resources()
    ["gpu"], none where the cluster schedules no GPUs) where `count` GPUs are visible: auto
    and cuda take the first assigned address as the CUDA index; auto without one is the CPU,
    so tasks Spark did not give a GPU never pile onto one."""
    gpu = assigned[0] if assigned else None
    if requested == "cpu":
        return Placement("cpu", gpu)
    if _index(requested) is not None:  # the user's own choice, on every task alike
        if count <= _index(requested):  # type: ignore[operator]
            raise ConfigError(f"device {requested!r}: this executor sees {count} CUDA device(s)")
        return Placement(requested, gpu, exclusive=False)
    if gpu is None:
        if requested == "cuda":
            raise ConfigError(
                "device 'cuda': Spark assigned this task no GPU; have the cluster schedule one"
                f" per task ({SPARK_GPU_CONF} with a discovery script), or use --device auto"
            )
        return Placement("cpu")
    if count == 0:
        if requested == "cuda":
            raise ConfigError(
                f"device 'cuda': Spark assigned this task GPU {gpu}, but torch sees no CUDA"
                " device in its executor"
            )
        return Placement("cpu", gpu)
    if not gpu.isdigit() or int(gpu) >= count:
        raise ConfigError(
            f"Spark assigned this task GPU address {gpu!r}, which is not one of the CUDA"
            f" indices 0 to {count - 1} this executor sees"
        )
    return Placement(f"cuda:{gpu}", gpu)


def needs_count(requested: str, assigned: Sequence[str] | None = None) -> bool:
    """Whether placing `requested` asks how many GPUs there are: not for cpu, nor for auto
    on a Spark task Spark gave no GPU, so those never load CUDA."""
    if requested == "cpu":
        return False
    return not (requested == "auto" and assigned is not None and not assigned)


def stages(device: str) -> bool:
    """Whether a worker on `device` keeps a host copy of its parameters for the exchange."""
    return device != "cpu" or os.environ.get(STAGING_ENV) == "1"


def _index(device: str) -> int | None:
    return int(device.split(":", 1)[1]) if ":" in device else None
