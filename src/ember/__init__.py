"""ember: data-parallel PyTorch training over a sharded parameter server, locally or on Spark.

Map (class or function -> file -> what it does):
- fit, evaluate_checkpoint -> api.py: train with the CLI's fields; score a checkpoint
- spark.fit -> spark.py: the same on a Spark DataFrame (engines/spark/ runs it)
- RunConfig, Strategy, STRATEGIES -> config.py: the validated run configuration; the strategies
  and what each implies
- RunResult -> engines/run.py: summary dict + trained torch.nn.Module + run directory
- EmberError, ConfigError, ProtocolError, ServerUnavailable, WorkerFailed, CheckpointError
  -> errors.py
- ParameterServer, PSClient -> ps/: the sharded parameter server and its client
- wire/, algorithms/, worker.py, data/, models/, checkpoint.py, metrics.py, engines/: see their
  own docstrings
"""

from ember import spark  # ember.spark.fit; pyspark itself is imported only when used
from ember._version import __version__
from ember.api import evaluate_checkpoint, fit
from ember.config import STRATEGIES, RunConfig, Strategy
from ember.engines.run import RunResult
from ember.errors import (
    CheckpointError,
    ConfigError,
    EmberError,
    ProtocolError,
    ServerUnavailable,
    WorkerFailed,
)

__all__ = [
    "STRATEGIES",
    "CheckpointError",
    "ConfigError",
    "EmberError",
    "ProtocolError",
    "RunConfig",
    "RunResult",
    "ServerUnavailable",
    "Strategy",
    "WorkerFailed",
    "__version__",
    "evaluate_checkpoint",
    "fit",
    "spark",
]
