"""What ember offers its lab on purpose: the parts a measurement drives directly, beside the
public face (`ember`, `ember.config`, `ember.errors`, `ember.metrics`, `ember.spark_ml`).

ember-lab (`ember bench`, `ember plan`, lab/benchmarks/) imports ember only through those
and this module (tests/unit/test_architecture.py holds it so), and none of these names is a
user's API: they may change with the code behind them, and the lab with them. A name the lab
needs is added here, in the group that says what it is for. Each is imported when first used
(PEP 562), so a benchmark of the wire never imports torch.

imports: algorithms, config, data, engines, export, models, ps, wire, worker
"""

# The imports under TYPE_CHECKING name what __getattr__ serves, for type checkers alone.
# ruff: noqa: F401
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ember.algorithms import flatten_parameters
    from ember.algorithms.rules import SGDRule
    from ember.config.flags import HELP, positive_int
    from ember.data import Dataset, load_dataset, shard_indices
    from ember.data.batches import MemoryBatches
    from ember.data.generate import generate, parse_size
    from ember.data.idx import MNIST_DIR
    from ember.data.spill import spill_batches
    from ember.data.stream import StreamPlan, plan_files, read_piece
    from ember.engines import LocalEngine, ParsedRun, engine_named
    from ember.engines.process import free_port, wait_ready
    from ember.engines.servers import ServerGroup
    from ember.engines.spark.jvm import class_archive
    from ember.engines.spark.session import end_spark
    from ember.export import MODEL_FILE, save_model
    from ember.models import build_model
    from ember.ps import ParameterServer, PSClient, ShardSpec, control, make_consistency
    from ember.ps.codec import CODECS, codec_named
    from ember.wire import CHUNK_BYTES, ClientConnection, bulk_cipher, curve, shared, use_encryption
    from ember.wire.sessions import CLOSING_SECONDS
    from ember.wire.sockets import server_io_threads, use_io_threads
    from ember.wire.striping import use_wire_lanes
    from ember.worker.device import placement, take
    from ember.worker.evaluation import evaluate, evaluates_after
    from ember.worker.loop import make_model
    from ember.worker.spec import load_data

_GROUPS = {  # module -> the names of it offered here
    # the parameter server, its client and the wire under them (exchange, hardening, cluster)
    "ember.ps": ("ParameterServer", "PSClient", "ShardSpec", "control", "make_consistency"),
    "ember.ps.codec": ("CODECS", "codec_named"),
    "ember.algorithms.rules": ("SGDRule",),
    "ember.wire": ("CHUNK_BYTES", "ClientConnection", "bulk_cipher", "curve", "shared"),
    "ember.wire.striping": ("use_wire_lanes",),
    "ember.wire.sockets": ("server_io_threads", "use_io_threads"),
    "ember.wire.curve": ("use_encryption",),
    "ember.wire.sessions": ("CLOSING_SECONDS",),
    # data and the worker's pieces timed alone (calibration, streaming, overhead)
    "ember.data": ("Dataset", "load_dataset", "shard_indices"),
    "ember.data.batches": ("MemoryBatches",),
    "ember.data.generate": ("generate", "parse_size"),
    "ember.data.idx": ("MNIST_DIR",),
    "ember.data.spill": ("spill_batches",),
    "ember.data.stream": ("StreamPlan", "plan_files", "read_piece"),
    "ember.algorithms": ("flatten_parameters",),
    "ember.models": ("build_model",),
    "ember.export": ("MODEL_FILE", "save_model"),
    "ember.worker.device": ("placement", "take"),
    "ember.worker.evaluation": ("evaluate", "evaluates_after"),
    "ember.worker.loop": ("make_model",),
    "ember.worker.spec": ("load_data",),
    # engines driven by a bench row: a run, a server group, Spark's session
    "ember.engines": ("LocalEngine", "ParsedRun", "engine_named"),
    "ember.engines.process": ("free_port", "wait_ready"),
    "ember.engines.servers": ("ServerGroup",),
    "ember.engines.spark.jvm": ("class_archive",),
    "ember.engines.spark.session": ("end_spark",),
    # the flags `ember bench` and `ember plan` share with `ember train`
    "ember.config.flags": ("HELP", "positive_int"),
}
_WHERE = {name: module for module, names in _GROUPS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'ember.probe' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name, None)
    if value is None:  # a submodule offered by name (wire's curve and shared)
        value = importlib.import_module(f"{module}.{name}")
    return value
