"""What an engine hands a worker (WorkerSpec), the data it loads, and what a checkpoint says
of its run (checkpoint_meta): torch-free, so that the launcher of a local run builds them
without importing torch, which only its workers need (engines/modelwork.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ember.config import RunConfig
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
    store: Any = None  # allreduce: a torch.distributed Store the engine opened, else rendezvous


def load_data(config: RunConfig) -> Dataset:
    return load_dataset(
        config.data,
        seed=config.seed,
        synthetic_samples=config.synthetic_samples,
        synthetic_features=config.synthetic_features,
    )


def checkpoint_meta(config: RunConfig, size: int, step: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": config.model,
        "data": config.data,
        "strategy": config.strategy,
        "parameters": size,
        "step": step,
        "config": config.to_dict(),
        **extra,
    }
