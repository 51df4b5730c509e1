"""Server-side update rules (the ps.UpdateRule protocol): SGD with momentum, and EASGD's center."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SGDRule:
    """Server optimizer for pushed gradients: buf = m * buf + g; p -= lr * buf (torch.optim.SGD,
    dampening 0). A synchronous round commits the mean of its gradients as one step."""

    lr: float
    momentum: float = 0.0
    name: str = "sgd"
    replies: bool = False

    @property
    def state_names(self) -> tuple[str, ...]:
        return ("momentum",) if self.momentum else ()

    def contribute(
        self, params: torch.Tensor, payload: torch.Tensor, out: torch.Tensor | None
    ) -> torch.Tensor:
        return payload

    def commit(
        self, params: torch.Tensor, state: dict[str, torch.Tensor], folded: torch.Tensor, count: int
    ) -> None:
        grad = folded if count == 1 else folded.div(count)
        if self.momentum:
            buf = state["momentum"]
            buf.mul_(self.momentum).add_(grad)
            grad = buf
        params.add_(grad, alpha=-self.lr)


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
        self, params: torch.Tensor, payload: torch.Tensor, out: torch.Tensor | None
    ) -> torch.Tensor:
        assert out is not None, "EASGD needs a reply buffer"
        torch.sub(payload, params, out=out)
        return out.mul_(self.alpha)

    def commit(
        self, params: torch.Tensor, state: dict[str, torch.Tensor], folded: torch.Tensor, count: int
    ) -> None:
        params.add_(folded)
