"""FlatModel: a module's whole state (trainable parameters, then its buffers) as one flat
float32 buffer, and its gradients as another."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ember.config.devices import stages


@dataclass
class _BufferSlot:
    """Where one of the module's persistent buffers lives in the flat vector. A float32 buffer
    is a view of its slot (the module updates it in place, as BatchNorm does); any other dtype
    is copied in by `gather_buffers` and back by `scatter_buffers`."""

    owner: torch.nn.Module  # the submodule that registered it
    leaf: str  # its name in owner._buffers
    name: str  # its state_dict key, for errors
    slot: torch.Tensor  # its slice of the flat vector, float32
    shape: torch.Size
    dtype: torch.dtype

    @property
    def current(self) -> torch.Tensor:
        return self.owner._buffers[self.leaf]  # type: ignore[return-value]

    def is_view(self, tensor: torch.Tensor) -> bool:
        return (
            tensor.dtype == torch.float32
            and tensor.data_ptr() == self.slot.data_ptr()
            and tensor.shape == self.shape
        )


BufferRef = tuple[str, torch.nn.Module, str, torch.Tensor]  # state_dict key, owner, leaf, value


def model_buffers(module: torch.nn.Module) -> list[BufferRef]:
    """Every persistent buffer, in state_dict order: what a saved model holds beside its
    parameters. Non-persistent ones are the model's to rebuild, and are not carried."""
    found: list[BufferRef] = []
    seen: set[int] = set()  # a buffer registered twice travels once
    for prefix, owner in module.named_modules():
        for leaf, buffer in owner._buffers.items():
            if buffer is None or leaf in owner._non_persistent_buffers_set:
                continue
            if id(buffer) not in seen:
                seen.add(id(buffer))
                found.append((f"{prefix}.{leaf}" if prefix else leaf, owner, leaf, buffer))
    return found


def flat_layout(module: torch.nn.Module) -> tuple[int, int]:
    """(parameter keys, buffer keys) of the module's flat vector."""
    params = sum(p.numel() for p in module.parameters() if p.requires_grad)
    return params, sum(buffer.numel() for *_, buffer in model_buffers(module))


class FlatModel:
    """Re-points every trainable parameter (and its .grad) at a slice of one contiguous buffer,
    followed by the module's persistent buffers (BatchNorm's running statistics and counts),
    so a whole model is pushed, pulled, all-reduced or saved as one array with no gather or
    scatter copies of its parameters.

    `params` holds keys [0, param_size) of parameters, then `buffer_size` keys of buffers, all
    float32 whatever a buffer's own dtype: integer buffers (num_batches_tracked) travel as
    float32, exact below 2**24, and are rounded when they return to the module. The buffers
    belong to the model for its lifetime; `.numpy()` views share their memory. Flat gradients
    cost a zeroing pass and an accumulating backward each step, so only the strategies that
    ship gradients ask for them; the others let autograd allocate them. The buffer keys of
    `grads` are staging room: autograd never writes there."""

    def __init__(
        self, module: torch.nn.Module, flat_grads: bool = True, staged: bool | None = None
    ) -> None:
        self.module = module
        self.flat_grads = flat_grads
        params = [p for p in module.parameters() if p.requires_grad]
        buffers = model_buffers(module)
        self.param_size = sum(p.numel() for p in params)
        self.buffer_size = sum(buffer.numel() for *_, buffer in buffers)
        self.size = self.param_size + self.buffer_size
        # the module's device (a model moves there before it is flattened)
        self.device = params[0].device if params else torch.device("cpu")
        self.params = torch.empty(self.size, dtype=torch.float32, device=self.device)
        size = self.size if flat_grads else 0
        self.grads = torch.zeros(size, dtype=torch.float32, device=self.device)
        offset = 0
        for p in params:
            n = p.numel()
            self.params[offset : offset + n].copy_(p.detach().reshape(-1))
            p.data = self.params[offset : offset + n].view_as(p)
            p.grad = self.grads[offset : offset + n].view_as(p) if flat_grads else None
            offset += n
        self.slots: list[_BufferSlot] = []
        for name, owner, leaf, buffer in buffers:
            n = buffer.numel()
            slot = self.params[offset : offset + n]
            self.slots.append(_BufferSlot(owner, leaf, name, slot, buffer.shape, buffer.dtype))
            offset += n
        self.gather_buffers()
        # Where the exchange reads and writes: the flat vector itself on the CPU; on a GPU a
        # host copy (pinned, so copies to and from the device run at full speed), which
        # to_host and from_host bring level with the device's at the algorithms' exchanges.
        self.staged = stages(str(self.device)) if staged is None else staged
        self.host, self.grads_host = self.params, self.grads
        if self.staged:
            pinned = self.device.type == "cuda"
            self.host = torch.empty(self.size, dtype=torch.float32, pin_memory=pinned)
            self.grads_host = torch.empty(len(self.grads), dtype=torch.float32, pin_memory=pinned)
            self.host.copy_(self.params)
        self.params_np: np.ndarray = self.host.numpy()
        self.grads_np: np.ndarray = self.grads_host.numpy()
        self.kept: torch.Tensor | None = None  # hand_over's copy, made on first use
        self._copier: Any = None  # on a GPU: the CUDA stream take_over copies on, and
        self._kept_at: Any = None  # the event hand_over's copy is done at

    @property
    def buffers(self) -> torch.Tensor:
        """The buffer keys of the flat vector (a view)."""
        return self.params[self.param_size :]

    def gather_buffers(self) -> None:
        """Bring the module's buffers into the flat vector before it is read (sent, saved,
        all-reduced). A float32 buffer is a view of its slot, so this costs nothing for it
        unless the module replaced the tensor, when its values are taken and it is a view
        again; other dtypes are copied in."""
        for entry in self.slots:
            current = entry.current
            if entry.is_view(current):
                continue
            if current.shape != entry.shape:
                raise ValueError(
                    f"buffer {entry.name!r} changed shape from {list(entry.shape)} to"
                    f" {list(current.shape)} during training; ember exchanges buffers of a"
                    " fixed shape"
                )
            with torch.no_grad():
                entry.slot.copy_(current.detach().reshape(-1))
            if current.dtype == torch.float32:
                entry.owner._buffers[entry.leaf] = entry.slot.view(entry.shape)

    def scatter_buffers(self) -> None:
        """Give the module its buffers back after the flat vector was written (pulled,
        loaded, moved by an exchange): a no-op for the float32 views."""
        with torch.no_grad():
            for entry in self.slots:
                current = entry.current
                if not entry.is_view(current):
                    current.copy_(_as_dtype(entry.slot, entry.dtype).view(entry.shape))

    def stage_buffers(self, target: torch.Tensor) -> torch.Tensor:
        """Copy the current buffers into the buffer keys of `target` (a gradient vector about
        to be sent): a push carries the worker's buffers beside its gradients."""
        if self.buffer_size:
            self.gather_buffers()
            target[self.param_size :].copy_(self.buffers)
        return target

    def zero_grad(self) -> None:
        if self.flat_grads:
            self.grads.zero_()  # never None: that would detach .grad from the flat buffer
        else:
            self.module.zero_grad(set_to_none=True)

    def to_host(self) -> np.ndarray:
        """params_np level with the parameters, after gather_buffers; returned. A copy from
        the device where the vector is staged, else nothing: params_np is the vector."""
        if self.staged:
            self.host.copy_(self.params)
        return self.params_np

    def from_host(self) -> None:
        """The parameters set to params_np after an exchange wrote there, before
        scatter_buffers: a copy to the device where staged, else nothing."""
        if self.staged:
            self.params.copy_(self.host)

    def subtract(self, values: np.ndarray) -> None:
        """x -= values (a host vector, easgd's elastic difference) in the parameters where
        they are, leaving steps taken since params_np was last brought level in place."""
        if self.staged:
            self.params.sub_(torch.from_numpy(values).to(self.device))
        else:
            self.params_np -= values

    def hand_over(self) -> None:
        """Keep a copy of the vector (after gather_buffers) where it is, for take_over on
        another thread: the training thread pays a copy on the device, not one to the host."""
        if self.kept is None:
            self.kept = torch.empty_like(self.params)
            if self.device.type == "cuda":
                self._copier = torch.cuda.Stream(self.device)
                self._kept_at = torch.cuda.Event()
        self.kept.copy_(self.params)
        if self._kept_at is not None:
            self._kept_at.record()  # on the training thread's stream, after the copy

    def take_over(self, target: np.ndarray) -> None:
        """The copy hand_over kept, into host memory `target`; on a GPU on a CUDA stream of
        the calling thread's own, which waits only for that copy, not for later steps."""
        assert self.kept is not None, "take_over before hand_over"
        if self._copier is None:
            np.copyto(target, self.kept.numpy())
            return
        with torch.cuda.stream(self._copier):
            self._copier.wait_event(self._kept_at)
            torch.from_numpy(target).copy_(self.kept, non_blocking=True)
        self._copier.synchronize()

    def host_grads(self, grads: torch.Tensor) -> np.ndarray:
        """A gradient vector of the device (flat.grads, or a sum of them) as the host array
        a push sends: its own memory on the CPU, a copy in the staging buffer where staged."""
        if not self.staged:
            return grads.numpy()
        self.grads_host.copy_(grads)
        return self.grads_np

    def load(self, values: np.ndarray | torch.Tensor) -> None:
        self.params.copy_(torch.as_tensor(values).reshape(-1))
        self.scatter_buffers()


def _as_dtype(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Float32 values in a buffer's own dtype: integers rounded, booleans thresholded."""
    if dtype == torch.bool:
        return values > 0.5
    if not dtype.is_floating_point and not dtype.is_complex:
        return values.round().to(dtype)
    return values.to(dtype)


def flatten_parameters(module: torch.nn.Module) -> np.ndarray:
    """A copy of a module's trainable parameters then its buffers as one float32 vector
    (FlatModel's order), leaving the module as it is."""
    parts = [p.detach().reshape(-1).float() for p in module.parameters() if p.requires_grad]
    for *_, buffer in model_buffers(module):
        parts.append(buffer.detach().reshape(-1).float())
    if not parts:
        return np.zeros(0, np.float32)
    return torch.cat(parts).numpy().copy()


def load_flat_parameters(module: torch.nn.Module, values: np.ndarray) -> None:
    """Copy a flat vector (FlatModel's order: parameters, then buffers) into a module."""
    params = [p for p in module.parameters() if p.requires_grad]
    buffers = [buffer for *_, buffer in model_buffers(module)]
    param_size, buffer_size = flat_layout(module)
    if values.shape != (param_size + buffer_size,):
        raise ValueError(
            f"a flat state of shape {values.shape} does not fit the model, which needs"
            f" ({param_size + buffer_size},): {param_size} parameters and {buffer_size}"
            " buffer values"
        )
    source = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(source[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        for buffer in buffers:
            part = source[offset : offset + buffer.numel()]
            buffer.copy_(_as_dtype(part, buffer.dtype).view_as(buffer))
            offset += buffer.numel()
