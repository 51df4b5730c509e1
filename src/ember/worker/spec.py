"""What an engine hands a worker (WorkerSpec), the data it loads, and what a checkpoint says
of its run (checkpoint_meta): torch-free, so that the launcher of a local run builds them
without importing torch, which only its workers need (engines/modelwork.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from ember.config import RunConfig, RunParts
from ember.config.objective import targets_of
from ember.config.objects import NO_OBJECTS, UserObjects
from ember.data import Dataset, load_dataset


@dataclass
class WorkerSpec:
    """Everything one worker process needs; built by an engine, handed to its child."""

    config: RunConfig
    rank: int
    world: int
    servers: list[str] = field(default_factory=list)
    secret: bytes = b""
    rendezvous: str = ""
    run_dir: str = "."
    incarnation: int = 0
    initial: np.ndarray | None = None  # starting parameters for strategies without a server
    initial_file: str | None = None  # or a safetensors file holding them as "params"
    initial_step: int = 0  # and the step they were saved at
    own_rows: bool = False  # the dataset's training rows are this worker's alone (a partition)
    # a joiner's: the run's epochs, whose learning-rate schedule it follows from where the
    # run stands (None: the worker's own epochs, from its own first step)
    schedule_epochs: int | None = None
    store: Any = None  # allreduce: a torch.distributed Store the engine opened, else rendezvous
    # what the run was handed as objects (config.model and the rest their labels): they
    # travel as the engine ships code to its own processes, never over ember's wire
    objects: UserObjects = NO_OBJECTS
    # ember.run: the user's function, run with these arguments in place of the built-in loop;
    # shipped as model_object is, never over ember's wire
    train_fn: Callable[..., Any] | None = None
    train_args: tuple[Any, ...] = ()
    layout: Layout | None = None  # the servers' flat state, which the loop's model must fit
    # a Spark task's GPU addresses as Spark assigned them (none: it schedules no GPUs); None
    # on the local engine, where a worker's rank picks its GPU
    gpus: tuple[str, ...] | None = None

    @property
    def dealt(self) -> bool:
        """Whether the worker's rows are dealt piece by piece by the servers (a worker
        range's run with servers, ps/pieces.py), not a shard cut for its rank."""
        return self.config.workers_max is not None and self.parts.strategy.uses_server

    @cached_property
    def parts(self) -> RunParts:
        """The run's configuration in the parts the worker's layers read, parsed once."""
        return RunParts.of(self.config)


@dataclass(frozen=True)
class UserLoop:
    """What ember.run hands an engine: the function every worker runs, and its arguments."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    has_model: bool = False  # model= was given: the servers start from its parameters
    has_data: bool = True  # data= was given; else the loop reads its own, unseen by the run


def load_data(config: RunConfig | RunParts) -> Dataset:
    """The run's data, its targets in the form the run's loss takes."""
    parts = config if isinstance(config, RunParts) else RunParts.of(config)
    data = parts.data
    return load_dataset(
        data.data,
        targets=targets_of(parts.training.loss),
        seed=data.seed,
        synthetic_samples=data.synthetic_samples,
        synthetic_features=data.synthetic_features,
    )


@dataclass(frozen=True)
class Layout:
    """How a model's flat state vector splits (FlatModel's order): its trainable parameters
    first, then its buffers (BatchNorm's statistics and counts), all float32."""

    parameters: int  # keys of trainable parameters, [0, parameters)
    buffers: int = 0  # keys of buffers, [parameters, parameters + buffers)

    @property
    def size(self) -> int:
        return self.parameters + self.buffers


def checkpoint_meta(
    config: RunConfig,
    layout: Layout,
    step: int,
    shape: tuple[tuple[int, ...], int] | None = None,
    objects: UserObjects = NO_OBJECTS,
    **extra: Any,
) -> dict[str, Any]:
    """What a checkpoint says of its run; `shape` (input shape, classes) lets ember.load
    rebuild the model without reading the data again, and `sources` where each object the
    run was handed is defined (ember evaluate names it: the file never imports on its own)."""
    where = {"input_shape": list(shape[0]), "num_classes": shape[1]} if shape else {}
    return {
        "model": config.model,
        "data": config.data,
        "strategy": config.strategy,
        "parameters": layout.parameters,
        "buffers": layout.buffers,
        **where,
        "step": step,
        "config": config.to_dict(),
        "sources": objects.sources(config.model),
        **extra,
    }
