"""ember: data-parallel PyTorch training over a sharded parameter server, locally or on Spark.

Map (class or function -> file -> what it does):
- fit, evaluate_checkpoint -> api.py: train with the CLI's fields; score a checkpoint
- run -> runs.py: your own training function on every worker; rank 0's value comes back
- context, Optimizer -> worker/userloop.py: inside that function, the worker's rank, data and
  report(); the wrapper of your torch.optim optimizer whose step() does the run's exchange
- load -> export.py: the trained nn.Module of a run directory or checkpoint (model.safetensors)
- predict -> predictions.py: a run's model over a file in batches, predictions written as it goes
- spark.fit -> spark.py: the same on a Spark DataFrame (engines/spark/ runs it)
- RunConfig, Strategy, STRATEGIES -> config/: the validated run configuration; the strategies
  and what each implies
- RunResult -> engines/rundir.py: summary dict + trained torch.nn.Module + run directory
- EmberError, ConfigError, ProtocolError, ServerUnavailable, WorkerFailed, CheckpointError
  -> errors.py
- ParameterServer, PSClient -> ps/: the sharded parameter server and its client
- wire/, algorithms/, worker/, data/, models/, checkpoint.py, metrics/, engines/: see their
  own docstrings

The names that need torch (fit, run, Optimizer, context, evaluate_checkpoint, RunResult,
spark) are imported when first used (PEP 562), so `import ember.<part>` costs only that part:
a parameter-server process imports ember.ps and never torch.

imports: _version, api, config, engines, errors, export, predictions, runs, spark, worker
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ember._version import __version__
from ember.config import STRATEGIES, RunConfig, Strategy
from ember.errors import (
    CheckpointError,
    ConfigError,
    EmberError,
    ProtocolError,
    ServerUnavailable,
    WorkerFailed,
)

if TYPE_CHECKING:
    from ember import spark
    from ember.api import evaluate_checkpoint, fit
    from ember.engines.rundir import RunResult
    from ember.export import load_model as load
    from ember.predictions import predict
    from ember.runs import run
    from ember.worker.userloop import Optimizer, context

_LAZY = {  # name -> the module that defines it
    "evaluate_checkpoint": "ember.api",
    "fit": "ember.api",
    "RunResult": "ember.engines.rundir",
    "load": "ember.export",
    "predict": "ember.predictions",
    "run": "ember.runs",
    "Optimizer": "ember.worker.userloop",
    "context": "ember.worker.userloop",
}
_RENAMED = {"load": "load_model"}  # the public name -> the name in its module


def __getattr__(name: str) -> Any:
    if name == "spark":  # ember.spark.fit; pyspark itself is imported only when used
        return importlib.import_module("ember.spark")
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), _RENAMED.get(name, name))
    raise AttributeError(f"module 'ember' has no attribute {name!r}")


__all__ = [
    "STRATEGIES",
    "CheckpointError",
    "ConfigError",
    "EmberError",
    "Optimizer",
    "ProtocolError",
    "RunConfig",
    "RunResult",
    "ServerUnavailable",
    "Strategy",
    "WorkerFailed",
    "__version__",
    "context",
    "evaluate_checkpoint",
    "fit",
    "load",
    "predict",
    "run",
    "spark",
]
