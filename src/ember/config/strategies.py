"""The strategies a run may name: each a point on two axes, the worker's algorithm and the
servers' consistency, and everything that point implies. Leaf module."""

from __future__ import annotations

import enum


class _Name(str, enum.Enum):
    """A name that is also its str: equal to, hashed like and formatted as its value, so JSON,
    YAML and the CLI see the plain name."""

    def __str__(self) -> str:
        return str(self.value)

    def __repr__(self) -> str:  # a message quoting one with !r reads 'bsp', as it did a name
        return repr(self.value)


class AlgorithmKind(_Name):
    """What a worker sends and how the server folds it in."""

    SINGLE = "single"
    SGD = "sgd"
    EASGD = "easgd"
    ALLREDUCE = "allreduce"
    DILOCO = "diloco"


class ConsistencyKind(_Name):
    """When the server may answer a worker; NONE where no server answers."""

    BSP = "bsp"
    SSP = "ssp"
    ASYNC = "async"
    NONE = "none"


class Strategy(_Name):
    """A named strategy: a point on the two axes, and everything that point implies."""

    SINGLE = "single"
    BSP = "bsp"
    SSP = "ssp"
    ASYNC = "async"
    EASGD = "easgd"
    EASGD_ASYNC = "easgd-async"
    ALLREDUCE = "allreduce"
    DILOCO = "diloco"

    @property
    def algorithm(self) -> AlgorithmKind:
        return _AXES[self][0]

    @property
    def consistency(self) -> ConsistencyKind:
        return _AXES[self][1]

    @property
    def uses_server(self) -> bool:
        return self.algorithm in (AlgorithmKind.SGD, AlgorithmKind.EASGD, AlgorithmKind.DILOCO)

    @property
    def synchronous(self) -> bool:
        """Every round waits for all workers: BSP's clocks, or all-reduce's collective."""
        return self.consistency is ConsistencyKind.BSP or self.algorithm is AlgorithmKind.ALLREDUCE

    @property
    def joinable(self) -> bool:
        """`ember join` can add a worker: a server to join, and no round that would wait for a
        newcomer or a leaver."""
        return self.uses_server and not self.synchronous

    @property
    def overlaps_exchange(self) -> bool:
        """An exchanger thread keeps the exchange off the worker's compute path (DeepSpark)."""
        return self is Strategy.EASGD_ASYNC

    @property
    def periodic(self) -> bool:
        """Workers step alone and exchange every tau local steps (easgd, diloco)."""
        return self.algorithm in (AlgorithmKind.EASGD, AlgorithmKind.DILOCO)

    @property
    def ships_gradients(self) -> bool:
        """The exchange moves gradients (not parameters)."""
        return self.algorithm in (AlgorithmKind.SGD, AlgorithmKind.ALLREDUCE)

    @property
    def local_optimizer(self) -> bool:
        """Workers step an optimizer of their own; under sgd the server's optimizer steps."""
        return self.algorithm is not AlgorithmKind.SGD


_AXES: dict[Strategy, tuple[AlgorithmKind, ConsistencyKind]] = {
    Strategy.SINGLE: (AlgorithmKind.SINGLE, ConsistencyKind.NONE),
    Strategy.BSP: (AlgorithmKind.SGD, ConsistencyKind.BSP),
    Strategy.SSP: (AlgorithmKind.SGD, ConsistencyKind.SSP),
    Strategy.ASYNC: (AlgorithmKind.SGD, ConsistencyKind.ASYNC),
    Strategy.EASGD: (AlgorithmKind.EASGD, ConsistencyKind.BSP),
    Strategy.EASGD_ASYNC: (AlgorithmKind.EASGD, ConsistencyKind.ASYNC),
    Strategy.ALLREDUCE: (AlgorithmKind.ALLREDUCE, ConsistencyKind.NONE),
    Strategy.DILOCO: (AlgorithmKind.DILOCO, ConsistencyKind.BSP),
}
STRATEGIES = tuple(s.value for s in Strategy)
