"""A checked training frame's Arrow batches as NumPy, in the tasks: pyarrow and NumPy only."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ember.data.dataset import Dataset
from ember.data.idx import normalize_images
from ember.errors import EmberError

FEATURES, LABEL = "features", "label"  # the column names of a checked training frame
WEIGHT = "weight"  # and of its rows' weights, where the run has a weight column


def partition_arrays(
    batches: Iterable[Any], input_shape: tuple[int, ...], like: Dataset | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """In a task: its partition's Arrow record batches as (rows, *input_shape) inputs, their
    targets, of the dtypes and target shape of `like`'s test rows (float32 and int64
    classes without it), and their float32 weights (None: the frame has no weight column)."""
    import pyarrow as pa

    batches = list(batches)
    if not batches:
        x_dtype, y_dtype, y_shape = _kinds(like)
        return np.empty((0, *input_shape), x_dtype), np.empty((0, *y_shape), y_dtype), None
    table = pa.Table.from_batches(batches)
    x, y = table_arrays(table, input_shape, like)
    if WEIGHT not in table.column_names:
        return x, y, None
    return x, y, np.ascontiguousarray(table.column(WEIGHT).to_numpy(), dtype=np.float32)


def _kinds(like: Dataset | None) -> tuple[np.dtype, np.dtype, tuple[int, ...]]:
    if like is None:
        return np.dtype(np.float32), np.dtype(np.int64), ()
    return like.x_test.dtype, like.y_test.dtype, tuple(like.y_test.shape[1:])


def values_like(input_shape: tuple[int, ...], width: int) -> Dataset:
    """A one-row Dataset of the kinds table_arrays converts a table of values to: float32
    inputs of `input_shape`, and `width` float32 values a row (0: one number a row)."""
    row = np.zeros((1, *input_shape), np.float32)
    target = np.zeros((1, width), np.float32) if width else np.zeros(1, np.float32)
    return Dataset("values", row, target, row, target, max(1, width), tuple(input_shape))


def table_arrays(
    table: Any, input_shape: tuple[int, ...], like: Dataset | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """A checked frame's Arrow table as (rows, *input_shape) inputs and their targets."""
    import pyarrow as pa
    import pyarrow.compute as pc

    x_dtype, y_dtype, y_shape = _kinds(like)
    column = table.column(FEATURES)
    if pa.types.is_binary(column.type):  # IDX images from frame_from_pixels
        x = normalize_images(_pixel_rows(column, input_shape))
    else:
        # list_flatten honours each chunk's offsets; to_numpy concatenates chunks in one copy
        x = pc.list_flatten(column).to_numpy()
        x = np.ascontiguousarray(x, dtype=x_dtype).reshape(table.num_rows, *input_shape)
    label = table.column(LABEL)
    if y_shape or not (pa.types.is_integer(label.type) or pa.types.is_floating(label.type)):
        y = pc.list_flatten(label).to_numpy().reshape(table.num_rows, *y_shape)
    else:
        y = label.to_numpy()
    y = np.ascontiguousarray(y, dtype=y_dtype)
    return (x if x.flags.writeable else x.copy()), (y if y.flags.writeable else y.copy())


def _pixel_rows(column: Any, input_shape: tuple[int, ...]) -> np.ndarray:
    """A binary column of images, each exactly prod(input_shape) bytes, as uint8 (n, rows, cols)."""
    width, parts = int(np.prod(input_shape)), []
    for chunk in column.chunks:
        if len(chunk) == 0:
            continue
        offsets = np.frombuffer(chunk.buffers()[1], np.int32)
        offsets = offsets[chunk.offset : chunk.offset + len(chunk) + 1]
        if chunk.null_count or np.any(np.diff(offsets) != width):
            raise EmberError(f"an image of the training frame is not {width} bytes")
        parts.append(np.frombuffer(chunk.buffers()[2], np.uint8)[offsets[0] : offsets[-1]])
    flat = parts[0] if len(parts) == 1 else np.concatenate([np.empty(0, np.uint8), *parts])
    return flat.reshape(-1, *input_shape[-2:])
