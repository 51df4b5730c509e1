"""A run's worker range (`--workers MIN:MAX`): the forms it is given in, and which runs take
one. Members join and leave between MIN and MAX while the run goes on; the parameter servers
keep who is in, so a strategy without them (allreduce, whose gloo group re-forms only by a
restart, and single) takes a fixed count."""

from __future__ import annotations

from typing import Any, Protocol

from ember.config.strategies import Strategy
from ember.errors import ConfigError

# the strategies that take a range: those whose state lives on the parameter servers
RANGE_STRATEGIES = tuple(sorted(s.value for s in Strategy if s.uses_server))


class Ranged(Protocol):
    workers: int
    workers_max: int | None
    max_workers: int | None
    strategy: str
    engine: str

    @property
    def uses_server(self) -> bool: ...


def worker_range(workers: Any, workers_max: Any) -> tuple[Any, Any]:
    """(MIN, MAX or None) from `--workers MIN:MAX` (a string, as the command line and YAML
    give it), `workers=(MIN, MAX)` in Python, or workers and workers_max apart. A MAX equal to
    MIN is a fixed run (None); anything else passes through for the type checks to name."""
    given = workers
    if isinstance(workers, str) and ":" in workers:
        low, _, high = workers.partition(":")
        try:
            given = (int(low), int(high))
        except ValueError:
            raise ConfigError(f"workers must be N or MIN:MAX, got {workers!r}") from None
    if not (isinstance(given, (tuple, list)) and len(given) == 2):
        return workers, workers_max
    low, high = given
    if workers_max is not None and workers_max != high:
        raise ConfigError(f"workers gives the range {low}:{high} and workers_max {workers_max}")
    return low, (None if high == low else high)


def check_worker_range(config: Ranged) -> None:
    """One clear error for a range that is upside down, or on a run that cannot take one."""
    low, high = config.workers, config.workers_max
    if high is None:
        return
    if not isinstance(high, int) or isinstance(high, bool) or high < low:
        raise ConfigError(f"a worker range's MAX must be >= its MIN, got workers {low}:{high}")
    if not config.uses_server:
        why = "it has no parameter server to keep the members"
        if config.strategy == Strategy.ALLREDUCE.value:
            why = "its gloo group re-forms only by a restart"
        raise ConfigError(
            f"strategy {config.strategy!r} takes a fixed worker count, not the range"
            f" {low}:{high} ({why}); the strategies that take a range:"
            f" {', '.join(RANGE_STRATEGIES)}"
        )
    if config.max_workers is not None and config.max_workers < high:
        raise ConfigError(
            f"max_workers ({config.max_workers}) must hold the range's {high} members at least"
        )
