"""FlatModel: a module's parameters and gradients as views into two flat float32 buffers."""

from __future__ import annotations

import numpy as np
import torch


class FlatModel:
    """Re-points every parameter (and its .grad) at a slice of one contiguous buffer, so a whole
    model is pushed, pulled or all-reduced as one array with no gather or scatter copies.

    The buffers belong to the model for its lifetime; `.numpy()` views share their memory.
    Flat gradients cost a zeroing pass and an accumulating backward each step, so only the
    strategies that ship gradients ask for them; the others let autograd allocate them.
    """

    def __init__(self, module: torch.nn.Module, flat_grads: bool = True) -> None:
        self.module = module
        self.flat_grads = flat_grads
        params = [p for p in module.parameters() if p.requires_grad]
        self.size = sum(p.numel() for p in params)
        self.params = torch.empty(self.size, dtype=torch.float32)
        self.grads = torch.zeros(self.size if flat_grads else 0, dtype=torch.float32)
        offset = 0
        for p in params:
            n = p.numel()
            self.params[offset : offset + n].copy_(p.detach().reshape(-1))
            p.data = self.params[offset : offset + n].view_as(p)
            p.grad = self.grads[offset : offset + n].view_as(p) if flat_grads else None
            offset += n
        self.params_np: np.ndarray = self.params.numpy()
        self.grads_np: np.ndarray = self.grads.numpy()

    def zero_grad(self) -> None:
        if self.flat_grads:
            self.grads.zero_()  # never None: that would detach .grad from the flat buffer
        else:
            self.module.zero_grad(set_to_none=True)

    def load(self, values: np.ndarray | torch.Tensor) -> None:
        self.params.copy_(torch.as_tensor(values).reshape(-1))


def flatten_parameters(module: torch.nn.Module) -> np.ndarray:
    """A copy of a module's trainable parameters as one float32 vector (FlatModel's order)."""
    parts = [p.detach().reshape(-1) for p in module.parameters() if p.requires_grad]
    return torch.cat(parts).to(torch.float32).numpy().copy()


def load_flat_parameters(module: torch.nn.Module, values: np.ndarray) -> None:
    """Copy a flat vector (FlatModel's order) into a module's parameters."""
    params = [p for p in module.parameters() if p.requires_grad]
    expected = sum(p.numel() for p in params)
    if values.shape != (expected,):
        raise ValueError(
            f"flat parameters have shape {values.shape}, the model needs ({expected},)"
        )
    source = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(source[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
