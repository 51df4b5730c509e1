"""`ember data generate`: a synthetic Parquet dataset of a given size, written row group by
row group (never whole in memory), as train.parquet and test.parquet in one folder, the
layout load_dataset and the streaming readers both take.

imports: numpy, pyarrow (lazily) and the data part
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ember.data.datasets import load_dataset, synthetic_model
from ember.errors import ConfigError

KINDS = ("synthetic-lr", "mnist-like", "mnist")
TEST_ROWS = 10_000  # at most: the test split is held in memory by the workers that evaluate
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20}
_UNITS |= {"GIB": 2**30, "TB": 10**12}

Block = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class Written:
    """What generate wrote: the folder, rows of each split, and bytes of feature data."""

    out: Path
    train_rows: int
    test_rows: int
    features: int
    row_groups: int

    def as_dict(self) -> dict[str, object]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in self.__dict__.items()}


def parse_size(text: str) -> int:
    """ "4GB", "512MiB", "1000000" -> bytes; an unknown unit is one clear error."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else ""
    if match is None or unit not in _UNITS:
        raise ConfigError(
            f"size must be a number and a unit (B, KB, MB, GB, TB, KiB, MiB, GiB); got {text!r}"
        )
    size = int(float(match.group(1)) * _UNITS[unit])
    if size < 1:
        raise ConfigError(f"size must be positive; got {text!r}")
    return size


def generate(
    kind: str,
    size: int,
    out: Path,
    *,
    features: int = 256,
    seed: int = 0,
    row_group_bytes: int = 16 << 20,
) -> Written:
    """Write `kind` as out/train.parquet (about `size` bytes of float32 features and int64
    labels, in row groups of about `row_group_bytes`) and out/test.parquet."""
    if kind not in KINDS:
        raise ConfigError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"out {out} exists and is not empty; choose another folder")
    if kind != "synthetic-lr":
        features = 784
    if features < 1:
        raise ConfigError(f"features must be >= 1; got {features}")
    row_bytes = features * 4 + 8
    rows = max(2, size // row_bytes)
    test = min(TEST_ROWS, max(1, rows // 10))
    group = max(1, row_group_bytes // row_bytes)
    blocks = _Rows(_SOURCES[kind](seed, rows, test, features))
    out.mkdir(parents=True, exist_ok=True)
    if kind == "mnist":
        rows, test = _mnist_rows()
    groups = _write(out / "train.parquet", blocks, rows, group, features)
    _write(out / "test.parquet", blocks, test, group, features)
    return Written(out, rows, test, features, groups)


class _Rows:
    """A source's blocks handed out a given number of rows at a time, the rest kept."""

    def __init__(self, blocks: Iterator[Block]) -> None:
        self.blocks, self.left = blocks, (np.empty((0, 0), np.float32), np.empty(0, np.int64))

    def take(self, most: int) -> Block:
        if not len(self.left[1]):
            self.left = next(self.blocks)
        x, y = self.left
        self.left = (x[most:], y[most:])
        return x[:most], y[:most]


def _write(path: Path, blocks: _Rows, rows: int, group: int, features: int) -> int:
    """`rows` rows of `blocks` into `path`, `group` rows to a row group; how many groups."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    # Required (non-null) columns and elements: a reader then decodes no definition levels,
    # which takes about a third off the time a row of features costs to read.
    element = pa.field("element", pa.float32(), nullable=False)
    schema = pa.schema(
        [
            pa.field("features", pa.list_(element), nullable=False),
            pa.field("label", pa.int64(), nullable=False),
        ]
    )
    done = written = 0
    # Random floats gain nothing from a dictionary, and a reader decodes dictionary pages of
    # them at half the speed of plain ones: only the labels get one.
    with pq.ParquetWriter(path, schema, compression="none", use_dictionary=["label"]) as writer:
        while done < rows:
            x, y = blocks.take(min(group, rows - done))
            take = len(y)
            x = np.ascontiguousarray(x, dtype=np.float32).reshape(take, features)
            offsets = pa.array(np.arange(0, (take + 1) * features, features, dtype=np.int32))
            column = pa.ListArray.from_arrays(offsets, pa.array(x.reshape(-1)), type=schema[0].type)
            writer.write_table(pa.table({"features": column, "label": y}, schema=schema))
            done, written = done + take, written + 1
    return written


def _synthetic_lr(seed: int, rows: int, test: int, features: int) -> Iterator[Block]:
    """load_dataset("synthetic-lr")'s model (weights, bias, N(0, 1) features, Bernoulli
    labels), drawn a block at a time."""
    rng, w, b = synthetic_model(seed, rows, features)
    block = max(1, (4 << 20) // (4 * features))
    while True:
        x = rng.standard_normal((block, features), dtype=np.float32)
        p = 1.0 / (1.0 + np.exp(-(x @ w).astype(np.float64) - b))
        yield x, (p > rng.random(block)).astype(np.int64)


def _mnist_like(seed: int, rows: int, test: int, features: int) -> Iterator[Block]:
    """28x28 images of ten classes: each class a fixed random blob pattern, each image its
    class's pattern shifted by a pixel or two, scaled and noised; normalized as MNIST is."""
    rng = np.random.default_rng(seed)
    patterns = (rng.random((10, 28, 28)) < 0.15).astype(np.float32)
    while True:
        y = rng.integers(0, 10, 4096)
        shifts = rng.integers(-2, 3, (len(y), 2))
        images = np.stack(
            [np.roll(patterns[c], tuple(s), axis=(0, 1)) for c, s in zip(y, shifts, strict=True)]
        )
        images = images * rng.uniform(0.6, 1.0, (len(y), 1, 1)).astype(np.float32)
        images += rng.normal(0.0, 0.3, images.shape).astype(np.float32)
        x = ((np.clip(images, 0.0, 1.0) - 0.1307) / 0.3081).astype(np.float32)
        yield x.reshape(len(y), 784), y.astype(np.int64)


def _mnist(seed: int, rows: int, test: int, features: int) -> Iterator[Block]:
    """The vendored MNIST itself, normalized as ember trains on it: the training rows, then
    the test rows (the size asked for does not apply)."""
    data = load_dataset("mnist")
    n = len(data.y_train)
    yield data.x_train.reshape(n, 784), data.y_train
    yield data.x_test.reshape(len(data.y_test), 784), data.y_test
    raise ConfigError("mnist: asked for more rows than it has")


def _mnist_rows() -> tuple[int, int]:
    return 60_000, 10_000


_SOURCES: dict[str, Callable[[int, int, int, int], Iterator[Block]]] = {
    "synthetic-lr": _synthetic_lr,
    "mnist-like": _mnist_like,
    "mnist": _mnist,
}

__all__ = ["KINDS", "Written", "generate", "parse_size"]
