"""Server-side update rules (the ps.UpdateRule protocol): SGD with momentum, EASGD's center,
and DiLoCo's outer Nesterov step.

NumPy only: the server process imports this module and never torch (its start-up would
otherwise be the import of torch). Every operation writes into an existing array (`out=`);
what needs a scaled copy uses the caller's scratch, so no update allocates."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ember.config import AlgorithmKind, ConsistencyKind, RunConfig
from ember.errors import ConfigError
from ember.ps.shard import UpdateRule


@dataclass(frozen=True)
class SGDRule:
    """Server optimizer for pushed gradients: buf = m * buf + g; p -= lr * buf (torch.optim.SGD,
    dampening 0). A synchronous round commits the mean of its gradients as one step. Under
    async and SSP each gradient is applied on its own, scaled by `rescale` (1 / workers, as
    MXNet's dist_async rescales), so a round of pushes moves as far as one synchronous step."""

    lr: float
    momentum: float = 0.0
    rescale: float = 1.0  # factor on every gradient before it is applied
    name: str = "sgd"
    replies: bool = False

    @property
    def state_names(self) -> tuple[str, ...]:
        return ("momentum",) if self.momentum else ()

    def contribute(
        self, params: np.ndarray, payload: np.ndarray, out: np.ndarray | None
    ) -> np.ndarray:
        return payload

    def commit(
        self,
        params: np.ndarray,
        state: dict[str, np.ndarray],
        folded: np.ndarray,
        count: int,
        scratch: np.ndarray,
    ) -> None:
        factor = self.rescale / count
        if self.momentum:
            buf = state["momentum"]
            np.multiply(buf, np.float32(self.momentum), out=buf)
            np.multiply(folded, np.float32(factor), out=scratch)
            np.add(buf, scratch, out=buf)
            np.multiply(buf, np.float32(self.lr), out=scratch)
        else:
            np.multiply(folded, np.float32(self.lr * factor), out=scratch)
        np.subtract(params, scratch, out=params)

    def commit_buffers(
        self,
        buffers: np.ndarray,
        state: dict[str, np.ndarray],
        folded: np.ndarray,
        count: int,
        scratch: np.ndarray,
    ) -> None:
        """A push's buffer keys carry how the worker's buffers (BatchNorm statistics) changed
        since it last pulled or pushed, not gradients: they are added, scaled as a gradient
        is (a synchronous round's mean; 1 / workers each under async and SSP), with no
        learning rate or optimizer state. Changes add up where values could not: error
        feedback under --compress stays exact, and a round of fresh pulls ends at the
        workers' mean."""
        np.multiply(folded, np.float32(self.rescale / count), out=scratch)
        np.add(buffers, scratch, out=buffers)


@dataclass(frozen=True)
class EASGDRule:
    """Elastic averaging (Zhang, Choromanska, LeCun 2015): a push carries a worker's x_i; the
    server answers e = alpha * (x_i - center) and moves center += e (summed over a synchronous
    round, the paper's center += alpha * sum_i (x_i - center)). The worker applies x_i -= e."""

    alpha: float
    name: str = "easgd"
    replies: bool = True
    state_names: tuple[str, ...] = ()

    def contribute(
        self, params: np.ndarray, payload: np.ndarray, out: np.ndarray | None
    ) -> np.ndarray:
        assert out is not None, "EASGD needs a reply buffer"
        np.subtract(payload, params, out=out)
        return np.multiply(out, np.float32(self.alpha), out=out)

    def commit(
        self,
        params: np.ndarray,
        state: dict[str, np.ndarray],
        folded: np.ndarray,
        count: int,
        scratch: np.ndarray,
    ) -> None:
        np.add(params, folded, out=params)

    # Buffers move elastically with the parameters, by the same moving rate alpha.
    commit_buffers = commit


def make_update_rule(config: RunConfig) -> UpdateRule:
    """The server's half of a strategy; only server strategies have one."""
    if config.algorithm is AlgorithmKind.SGD:
        rescale = 1.0 if config.consistency is ConsistencyKind.BSP else 1.0 / config.workers
        return SGDRule(lr=config.lr, momentum=config.momentum, rescale=rescale)
    if config.algorithm is AlgorithmKind.EASGD:
        return EASGDRule(alpha=config.effective_alpha)
    if config.algorithm is AlgorithmKind.DILOCO:
        return DiLoCoRule(lr=config.outer_lr, momentum=config.outer_momentum)
    raise ConfigError(f"strategy {config.strategy!r} uses no parameter server")


@dataclass(frozen=True)
class DiLoCoRule:
    """DiLoCo's outer optimizer (Douillard et al. 2023): a push carries a worker's
    pseudo-gradient, the parameters it began its period from minus its parameters now; a
    synchronous round commits their mean g as one step of Nesterov SGD, torch.optim.SGD's
    arithmetic with dampening 0: buf = m * buf + g; p -= lr * (g + m * buf). The momentum
    buffer is per key rule state, so it is copied to the backup and checkpointed with the
    parameters. Pushes are not answered; a worker pulls the new parameters with its push."""

    lr: float
    momentum: float = 0.0
    name: str = "diloco"
    replies: bool = False

    @property
    def state_names(self) -> tuple[str, ...]:
        return ("momentum",) if self.momentum else ()

    def contribute(
        self, params: np.ndarray, payload: np.ndarray, out: np.ndarray | None
    ) -> np.ndarray:
        return payload

    def commit(
        self,
        params: np.ndarray,
        state: dict[str, np.ndarray],
        folded: np.ndarray,
        count: int,
        scratch: np.ndarray,
    ) -> None:
        mean = np.multiply(folded, np.float32(1 / count), out=scratch)
        if not self.momentum:
            np.multiply(mean, np.float32(self.lr), out=scratch)
            np.subtract(params, scratch, out=params)
            return
        buf = state["momentum"]
        np.multiply(buf, np.float32(self.momentum), out=buf)
        np.add(buf, mean, out=buf)
        # lr * (g + m * buf) as two subtractions: one scratch array holds g, then m * buf
        np.multiply(mean, np.float32(self.lr), out=scratch)
        np.subtract(params, scratch, out=params)
        np.multiply(buf, np.float32(self.lr * self.momentum), out=scratch)
        np.subtract(params, scratch, out=params)

    def commit_buffers(
        self,
        buffers: np.ndarray,
        state: dict[str, np.ndarray],
        folded: np.ndarray,
        count: int,
        scratch: np.ndarray,
    ) -> None:
        """The buffer keys (BatchNorm statistics) carry start minus now too, but take a plain
        mean with no outer step: every worker began the period from the servers' buffers, so
        subtracting the mean of start - now sets them to the workers' mean. Running statistics
        are estimates, not parameters to extrapolate with lr and momentum; and changes add up,
        so error feedback under --compress stays exact."""
        np.multiply(folded, np.float32(1 / count), out=scratch)
        np.subtract(buffers, scratch, out=buffers)
