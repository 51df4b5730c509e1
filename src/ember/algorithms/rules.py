"""Server-side update rules (the ps.UpdateRule protocol): SGD with momentum, and EASGD's center."""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
        self, params: torch.Tensor, payload: torch.Tensor, out: torch.Tensor | None
    ) -> torch.Tensor:
        return payload

    def commit(
        self, params: torch.Tensor, state: dict[str, torch.Tensor], folded: torch.Tensor, count: int
    ) -> None:
        factor = self.rescale / count  # in-place scaled adds: no temporary the size of params
        if self.momentum:
            buf = state["momentum"]
            buf.mul_(self.momentum).add_(folded, alpha=factor)
            params.add_(buf, alpha=-self.lr)
        else:
            params.add_(folded, alpha=-self.lr * factor)


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
