"""Server-side update rules (the ps.UpdateRule protocol): SGD with momentum, Adam and AdamW,
EASGD's center, and DiLoCo's outer Nesterov step.

NumPy only: the server process imports this module and never torch (its start-up would
otherwise be the import of torch). Every operation writes into an existing array (`out=`);
what needs a scaled copy uses the caller's scratch, so no update allocates."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ember.config import AlgorithmKind, ConsistencyKind, RunConfig, ServerSettings
from ember.config.training import CONSTANT, Schedule
from ember.errors import ConfigError
from ember.ps.shard import UpdateRule


def _gradient(
    params: np.ndarray,
    folded: np.ndarray,
    factor: float,
    weight_decay: float,
    scratch: np.ndarray,
) -> np.ndarray:
    """scratch = factor * folded (+ weight_decay * params: an L2 term, as torch.optim adds it)."""
    if weight_decay:
        np.multiply(params, np.float32(weight_decay / factor), out=scratch)
        np.add(scratch, folded, out=scratch)
        return np.multiply(scratch, np.float32(factor), out=scratch)
    return np.multiply(folded, np.float32(factor), out=scratch)


class _PushedGradients:
    """What the optimizers over pushed gradients share: a push contributes its payload as it
    is, and the model's buffer keys are folded as changes."""

    rescale: float

    def contribute(
        self, params: np.ndarray, payload: np.ndarray, out: np.ndarray | None
    ) -> np.ndarray:
        return payload

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
class SGDRule(_PushedGradients):
    """Server optimizer for pushed gradients: g += wd * p; buf = m * buf + g; p -= lr * buf
    (torch.optim.SGD, dampening 0), lr following the schedule over the server's commits. A
    synchronous round commits the mean of its gradients as one step. Under async and SSP
    each gradient is applied on its own, scaled by `rescale` (1 / workers, as MXNet's
    dist_async rescales), so a round of pushes moves as far as one synchronous step."""

    lr: float
    momentum: float = 0.0
    rescale: float = 1.0  # factor on every gradient before it is applied
    weight_decay: float = 0.0
    schedule: Schedule = CONSTANT
    name: str = "sgd"
    replies: bool = False

    @property
    def state_names(self) -> tuple[str, ...]:
        return ("momentum",) if self.momentum else ()

    def commit(
        self,
        params: np.ndarray,
        state: dict[str, np.ndarray],
        folded: np.ndarray,
        count: int,
        scratch: np.ndarray,
        step: int = 1,
    ) -> None:
        lr = self.lr * self.schedule.factor(step - 1)
        factor = self.rescale / count
        if self.momentum:
            buf = state["momentum"]
            np.multiply(buf, np.float32(self.momentum), out=buf)
            np.add(buf, _gradient(params, folded, factor, self.weight_decay, scratch), out=buf)
            np.multiply(buf, np.float32(lr), out=scratch)
        elif self.weight_decay:
            _gradient(params, folded, factor, self.weight_decay, scratch)
            np.multiply(scratch, np.float32(lr), out=scratch)
        else:
            np.multiply(folded, np.float32(lr * factor), out=scratch)
        np.subtract(params, scratch, out=params)


@dataclass(frozen=True)
class AdamRule(_PushedGradients):
    """Adam (Kingma and Ba) over a shard, as torch.optim.Adam and AdamW step: the moments are
    per-key rule state (replicated and checkpointed with the parameters), bias-corrected by
    the server's commit count; AdamW decays the parameters by lr * weight_decay first, Adam
    adds weight_decay * p to the gradient. Gradients are scaled as SGDRule scales them."""

    lr: float
    decoupled: bool = False  # AdamW
    rescale: float = 1.0
    weight_decay: float = 0.0
    schedule: Schedule = CONSTANT
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    replies: bool = False
    state_names: tuple[str, ...] = ("exp_avg", "exp_avg_sq")

    @property
    def name(self) -> str:
        return "adamw" if self.decoupled else "adam"

    def commit(
        self,
        params: np.ndarray,
        state: dict[str, np.ndarray],
        folded: np.ndarray,
        count: int,
        scratch: np.ndarray,
        step: int = 1,
    ) -> None:
        lr = self.lr * self.schedule.factor(step - 1)
        beta1, beta2 = self.betas
        if self.decoupled and self.weight_decay:
            np.multiply(params, np.float32(1 - lr * self.weight_decay), out=params)
        l2 = 0.0 if self.decoupled else self.weight_decay
        grad = _gradient(params, folded, self.rescale / count, l2, scratch)
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        # exp_avg += (1 - beta1) (g - exp_avg), in place: one scratch serves every pass
        np.subtract(exp_avg, grad, out=exp_avg)
        np.multiply(exp_avg, np.float32(beta1), out=exp_avg)
        np.add(exp_avg, grad, out=exp_avg)
        np.multiply(exp_avg_sq, np.float32(beta2), out=exp_avg_sq)
        np.multiply(grad, grad, out=scratch)
        np.multiply(scratch, np.float32(1 - beta2), out=scratch)
        np.add(exp_avg_sq, scratch, out=exp_avg_sq)
        correction1, correction2 = 1 - beta1**step, 1 - beta2**step
        np.sqrt(exp_avg_sq, out=scratch)
        np.multiply(scratch, np.float32(1 / math.sqrt(correction2)), out=scratch)
        np.add(scratch, np.float32(self.eps), out=scratch)
        np.divide(exp_avg, scratch, out=scratch)
        np.multiply(scratch, np.float32(lr / correction1), out=scratch)
        np.subtract(params, scratch, out=params)


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
        step: int = 1,
    ) -> None:
        np.add(params, folded, out=params)

    # Buffers move elastically with the parameters, by the same moving rate alpha.
    commit_buffers = commit


def make_update_rule(config: RunConfig | ServerSettings, steps_per_worker: int = 0) -> UpdateRule:
    """The server's half of a strategy; only server strategies have one. Its schedule runs
    over the server's commits: one a round under BSP, one a push (workers a round) else."""
    if config.algorithm is AlgorithmKind.SGD:
        synchronous = config.consistency is ConsistencyKind.BSP
        rescale = 1.0 if synchronous else 1.0 / config.workers
        commits = steps_per_worker if synchronous else steps_per_worker * config.workers
        schedule = Schedule(config.scheduler, commits, config.warmup_steps)
        decay = config.weight_decay
        optimizer = config.optimizer.lower()
        if optimizer in ("adam", "adamw"):
            args = config.optimizer_args
            betas = tuple(float(b) for b in args.get("betas", (0.9, 0.999)))
            eps = float(args.get("eps", 1e-8))
            decoupled = optimizer == "adamw"
            return AdamRule(config.lr, decoupled, rescale, decay, schedule, betas, eps)  # type: ignore[arg-type]
        return SGDRule(config.lr, config.momentum, rescale, decay, schedule)
    if config.algorithm is AlgorithmKind.EASGD:
        return EASGDRule(alpha=config.effective_alpha)
    if config.algorithm is AlgorithmKind.DILOCO:
        return DiLoCoRule(lr=config.outer_lr, momentum=config.outer_momentum)
    raise ConfigError(f"strategy {config.strategy!r} uses no parameter server")


@dataclass(frozen=True)
class DiLoCoRule(_PushedGradients):
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

    def commit(
        self,
        params: np.ndarray,
        state: dict[str, np.ndarray],
        folded: np.ndarray,
        count: int,
        scratch: np.ndarray,
        step: int = 1,
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
