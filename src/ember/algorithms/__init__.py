"""Algorithms: what a worker sends and how the server folds it in.

Map:
- make_algorithm, ALGORITHMS -> __init__.py: the strategy registry; its names are imported
  when first used, so the server's rules.py comes without torch
- make_update_rule -> rules.py: a strategy's server half
- WorkerContext, CommStats, Algorithm -> base.py: shared context, counters and protocol
- FlatModel, flatten_parameters, load_flat_parameters -> flat.py: parameters as one buffer
- SGDRule, EASGDRule, DiLoCoRule -> rules.py: server-side update rules (ps.UpdateRule)
- ServerSGD -> sgd.py: push gradients / pull parameters (bsp, ssp, async)
- SyncEASGD, AsyncEASGD -> easgd.py: elastic averaging, the async one with an exchanger thread
- DiLoCo -> diloco.py: tau inner steps, then the servers' outer Nesterov step (DiLoCo)
- StreamingDiLoCo -> streaming.py: diloco in fragments synced at staggered steps, overlapped
- AllReduceSGD -> allreduce.py: gloo all-reduce of gradients (Horovod/DDP baseline)
- LocalSGD -> local.py: the single-process baseline

imports: config, errors, models, ps
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ember.algorithms.rules import DiLoCoRule, EASGDRule, SGDRule, make_update_rule
from ember.config import Strategy

if TYPE_CHECKING:
    from ember.algorithms.allreduce import AllReduceSGD
    from ember.algorithms.base import (
        Algorithm,
        CommStats,
        MomentumSGD,
        ScheduledOptimizer,
        WorkerContext,
        local_optimizer,
    )
    from ember.algorithms.diloco import DiLoCo
    from ember.algorithms.easgd import AsyncEASGD, SyncEASGD
    from ember.algorithms.flat import FlatModel, flatten_parameters, load_flat_parameters
    from ember.algorithms.local import LocalSGD
    from ember.algorithms.sgd import ServerSGD
    from ember.algorithms.streaming import StreamingDiLoCo

# The worker side imports torch; the server process needs only rules.py, so these names are
# imported when first used (PEP 562), never by `import ember.algorithms.rules`.
_LAZY = {
    "AllReduceSGD": "allreduce",
    "Algorithm": "base",
    "CommStats": "base",
    "WorkerContext": "base",
    "local_optimizer": "base",
    "MomentumSGD": "base",
    "ScheduledOptimizer": "base",
    "DiLoCo": "diloco",
    "StreamingDiLoCo": "streaming",
    "AsyncEASGD": "easgd",
    "SyncEASGD": "easgd",
    "FlatModel": "flat",
    "flatten_parameters": "flat",
    "load_flat_parameters": "flat",
    "LocalSGD": "local",
    "ServerSGD": "sgd",
}


def __getattr__(name: str) -> Any:
    if name == "ALGORITHMS":
        return _algorithms()
    if name in _LAZY:
        return getattr(importlib.import_module(f"ember.algorithms.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'ember.algorithms' has no attribute {name!r}")


@functools.cache  # one registry, built at its first use
def _algorithms() -> dict[Strategy, Callable[[WorkerContext], Algorithm]]:
    from ember.algorithms.allreduce import AllReduceSGD
    from ember.algorithms.diloco import make_diloco
    from ember.algorithms.easgd import AsyncEASGD, SyncEASGD
    from ember.algorithms.local import LocalSGD
    from ember.algorithms.sgd import ServerSGD

    return {
        Strategy.SINGLE: LocalSGD,
        Strategy.BSP: ServerSGD,
        Strategy.SSP: ServerSGD,
        Strategy.ASYNC: ServerSGD,
        Strategy.EASGD: SyncEASGD,
        Strategy.EASGD_ASYNC: AsyncEASGD,
        Strategy.ALLREDUCE: AllReduceSGD,
        Strategy.DILOCO: make_diloco,
    }


def make_algorithm(context: WorkerContext) -> Algorithm:
    # the strategy part holds a Strategy: an unknown name failed where it was parsed
    return _algorithms()[context.strategy.strategy](context)


__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "AllReduceSGD",
    "AsyncEASGD",
    "CommStats",
    "DiLoCo",
    "DiLoCoRule",
    "EASGDRule",
    "FlatModel",
    "LocalSGD",
    "MomentumSGD",
    "SGDRule",
    "ScheduledOptimizer",
    "ServerSGD",
    "StreamingDiLoCo",
    "SyncEASGD",
    "WorkerContext",
    "flatten_parameters",
    "load_flat_parameters",
    "local_optimizer",
    "make_algorithm",
    "make_update_rule",
]
