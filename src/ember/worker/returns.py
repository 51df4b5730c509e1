"""What `ember.run` hands back across the process boundary: rank 0's return value as msgpack.

Numbers, strings, bytes, lists (tuples arrive as lists), dicts and None are msgpack's own;
NumPy arrays and torch tensors travel as an extension type holding their dtype, shape and
raw bytes. Nothing is pickled, so a value read back can hold only these. Imports numpy and
msgpack; torch only to encode a tensor, or to decode one.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

_NUMPY, _TORCH = 1, 2  # the extension type codes


class UnencodableValue(TypeError):
    """A return value holds something msgpack cannot carry without pickle."""


def encode(value: Any) -> bytes:
    """`value` as msgpack bytes; UnencodableValue names the first type that cannot travel."""
    return msgpack.packb(value, default=_extension, use_bin_type=True)


def decode(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_from_extension, raw=False, strict_map_key=False)


def _extension(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject or value.dtype.names is not None:
            raise UnencodableValue(
                f"a NumPy array of dtype {value.dtype} cannot be returned: only arrays of"
                " numbers and booleans travel without pickle"
            )
        array = np.ascontiguousarray(value)
        return msgpack.ExtType(_NUMPY, _pack(array.dtype.str, array.shape, array.tobytes()))
    if isinstance(value, np.generic):  # a NumPy scalar travels as the number it holds
        return value.item()
    module = type(value).__module__
    if module.startswith("torch") and type(value).__name__ in ("Tensor", "Parameter"):
        tensor = value.detach().cpu().contiguous()
        # as bytes through a uint8 view: bfloat16 and the other dtypes NumPy lacks travel too
        raw = tensor.reshape(-1).view(-1).view(_torch().uint8).numpy().tobytes()
        dtype = str(tensor.dtype).removeprefix("torch.")
        return msgpack.ExtType(_TORCH, _pack(dtype, tuple(tensor.shape), raw))
    kind = type(value)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{module}.{kind.__qualname__}"
    raise UnencodableValue(
        f"the return value holds a {name}, which cannot travel"
        " from the worker without pickle; return numbers, strings, bytes, lists, dicts, None,"
        " NumPy arrays or torch tensors (e.g. model.state_dict() rather than the model)"
    )


def _pack(dtype: str, shape: tuple[int, ...], raw: bytes) -> bytes:
    return msgpack.packb([dtype, list(shape), raw], use_bin_type=True)


def _from_extension(code: int, data: bytes) -> Any:
    dtype, shape, raw = msgpack.unpackb(data, raw=False)
    if code == _NUMPY:
        return np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape).copy()
    if code == _TORCH:
        torch = _torch()
        kind = getattr(torch, dtype)
        if not raw:
            return torch.empty(shape, dtype=kind)
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(kind).reshape(shape)
    return msgpack.ExtType(code, data)


def _torch() -> Any:
    import torch

    return torch
