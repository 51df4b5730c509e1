"""IDX images travel to Spark tasks as their uint8 bytes and arrive as the loader's floats."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pyarrow as pa
import pytest

from ember.data import load_dataset
from ember.data.arrow import FEATURES, LABEL, table_arrays
from ember.data.datasets import train_pixels
from ember.data.spark import pixel_column
from ember.errors import EmberError

pytestmark = pytest.mark.timeout(60)


def test_digits_pixels_decode_to_exactly_the_floats_the_loader_gives() -> None:
    digits = load_dataset("digits")
    pixels = train_pixels(digits)
    assert pixels is not None and pixels.dtype == np.uint8 and pixels.shape == (10_000, 28, 28)
    # a table of several batches, one of them a slice whose offsets do not start at zero
    column = pixel_column(pixels)
    starts = (0, 3000, 7000, 10_000)
    table = pa.Table.from_batches(
        [
            pa.RecordBatch.from_arrays(
                [column.slice(a, b - a), pa.array(digits.y_train[a:b])], [FEATURES, LABEL]
            )
            for a, b in itertools.pairwise(starts)
        ]
    )
    x, y = table_arrays(table, digits.input_shape)
    assert x.dtype == np.float32 and x.flags.writeable
    np.testing.assert_array_equal(x, digits.x_train)  # bit for bit, not merely close
    np.testing.assert_array_equal(y, digits.y_train)


def test_only_unchanged_idx_data_is_shipped_as_pixels(tmp_path) -> None:
    digits = load_dataset("digits")
    changed = digits.x_train.copy()
    changed[0, 0, 0, 0] += 1.0
    assert train_pixels(dataclasses.replace(digits, x_train=changed)) is None
    assert train_pixels(load_dataset("synthetic-lr", synthetic_samples=200)) is None


def test_an_image_of_the_wrong_size_is_an_error() -> None:
    ragged = pa.array([b"\x00" * 784, b"\x00" * 783], type=pa.binary())
    table = pa.table({FEATURES: ragged, LABEL: pa.array([0, 1])})
    with pytest.raises(EmberError, match="not 784 bytes"):
        table_arrays(table, (1, 28, 28))
