"""The worker: what every engine runs once per rank, the same on each.

A worker takes a `WorkerSpec` from its engine, loads its shard of the run's data, and runs one
training function (the user's, or the built-in loop over the same `ember.Optimizer`) against the
run's servers or gloo group; worker 0 also evaluates. Where each piece lives:

- `spec.py`       WorkerSpec (what an engine hands a worker), the data it loads, checkpoint
                  metadata; torch-free, so a launcher builds specs without importing torch
- `loop.py`       run_worker (one rank from start to finish) and the built-in training loop
- `userloop.py`   ember.context() (rank, world, shard, report) and ember.Optimizer, whose step()
                  does the run's exchange
- `data.py`       WorkerData: the worker's shard, as every training function reads it (ctx.data)
- `pieces.py`     a worker range's rows, dealt piece by piece by the servers' data cursor
- `device.py`     the device a worker takes, its forward precision, batches moved one step ahead
- `evaluation.py` when worker 0 evaluates, and a model's loss and metrics on a held-out set
- `returns.py`    rank 0's return value, encoded as msgpack to cross the process boundary
- `torchrun.py`   torchrun's variables for a torch.distributed loop, a .py script run as __main__

The names below load on first use, so importing `ember.worker.spec` does not import torch.

imports: algorithms, checkpoint, config, data, errors, metrics, models, ps, wire
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ember.worker.data import WorkerData
    from ember.worker.loop import run_worker
    from ember.worker.spec import WorkerSpec
    from ember.worker.userloop import Optimizer, context

_FACE = {  # name -> the module of this package that defines it
    "WorkerSpec": "spec",
    "run_worker": "loop",
    "Optimizer": "userloop",
    "context": "userloop",
    "WorkerData": "data",
}

__all__ = ["Optimizer", "WorkerData", "WorkerSpec", "context", "run_worker"]


def __getattr__(name: str) -> Any:
    if name not in _FACE:
        raise AttributeError(f"module 'ember.worker' has no attribute {name!r}")
    return getattr(importlib.import_module(f"ember.worker.{_FACE[name]}"), name)
