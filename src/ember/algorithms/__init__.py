"""Algorithms: what a worker sends and how the server folds it in.

Map:
- make_algorithm, make_update_rule -> __init__.py: the strategy registry (one dict each)
- WorkerContext, CommStats, Algorithm -> base.py: shared context, counters and protocol
- FlatModel, flatten_parameters, load_flat_parameters -> flat.py: parameters as one buffer
- SGDRule, EASGDRule -> rules.py: server-side update rules (ps.UpdateRule)
- ServerSGD -> sgd.py: push gradients / pull parameters (bsp, ssp, async)
- SyncEASGD, AsyncEASGD -> easgd.py: elastic averaging, the async one with an exchanger thread
- AllReduceSGD -> allreduce.py: gloo all-reduce of gradients (Horovod/DDP baseline)
- LocalSGD -> local.py: the single-process baseline
"""

from __future__ import annotations

from collections.abc import Callable

from ember.algorithms.allreduce import AllReduceSGD
from ember.algorithms.base import Algorithm, CommStats, WorkerContext, local_optimizer
from ember.algorithms.easgd import AsyncEASGD, SyncEASGD
from ember.algorithms.flat import FlatModel, flatten_parameters, load_flat_parameters
from ember.algorithms.local import LocalSGD
from ember.algorithms.rules import EASGDRule, SGDRule
from ember.algorithms.sgd import ServerSGD
from ember.config import AlgorithmKind, ConsistencyKind, RunConfig, Strategy
from ember.errors import ConfigError
from ember.ps import UpdateRule

ALGORITHMS: dict[Strategy, Callable[[WorkerContext], Algorithm]] = {
    Strategy.SINGLE: LocalSGD,
    Strategy.BSP: ServerSGD,
    Strategy.SSP: ServerSGD,
    Strategy.ASYNC: ServerSGD,
    Strategy.EASGD: SyncEASGD,
    Strategy.EASGD_ASYNC: AsyncEASGD,
    Strategy.ALLREDUCE: AllReduceSGD,
}


def make_algorithm(context: WorkerContext) -> Algorithm:
    try:
        factory = ALGORITHMS[Strategy(context.config.strategy)]
    except ValueError:
        raise ConfigError(
            f"strategy must be one of {', '.join(ALGORITHMS)}; got {context.config.strategy!r}"
        ) from None
    return factory(context)


def make_update_rule(config: RunConfig) -> UpdateRule:
    """The server's half of a strategy; only server strategies have one."""
    if config.algorithm is AlgorithmKind.SGD:
        rescale = 1.0 if config.consistency is ConsistencyKind.BSP else 1.0 / config.workers
        return SGDRule(lr=config.lr, momentum=config.momentum, rescale=rescale)
    if config.algorithm is AlgorithmKind.EASGD:
        return EASGDRule(alpha=config.effective_alpha)
    raise ConfigError(f"strategy {config.strategy!r} uses no parameter server")


__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "AllReduceSGD",
    "AsyncEASGD",
    "CommStats",
    "EASGDRule",
    "FlatModel",
    "LocalSGD",
    "SGDRule",
    "ServerSGD",
    "SyncEASGD",
    "WorkerContext",
    "flatten_parameters",
    "load_flat_parameters",
    "local_optimizer",
    "make_algorithm",
    "make_update_rule",
]
