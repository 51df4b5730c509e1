"""A train/test split as NumPy arrays (Dataset), what its targets may be, and the rows each
worker of a run trains on: what every data module builds on, so it imports none of them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ember.errors import ConfigError


@dataclass(frozen=True, eq=False)
class Dataset:
    """A train/test split as NumPy arrays; the caller owns the arrays and may write to them."""

    name: str  # the spec it was loaded from: a dataset name or a path
    x_train: np.ndarray  # C-contiguous, shape (n, *input_shape): float32 features, int64 ids,
    # or a structured array of several named inputs
    y_train: np.ndarray  # shape (n, ...): int64 class indices in [0, num_classes), or floats
    x_test: np.ndarray  # as x_train, shape (m, *input_shape)
    y_test: np.ndarray  # as y_train, shape (m, ...)
    num_classes: int  # output width of the model: classes, or values per row for floats
    input_shape: tuple[int, ...]  # shape of one example, e.g. (1, 28, 28) or (100,)
    held_out: bool = False  # the test rows are a file's last rows: it has no test split
    # float32, shape (n,): each training row's weight in the loss (a weight column); None: 1
    w_train: np.ndarray | None = None

    def __post_init__(self) -> None:
        where = f"dataset {self.name}"
        if self.num_classes < 1:
            raise ConfigError(f"{where}: num_classes must be >= 1, got {self.num_classes}")
        for split in ("train", "test"):
            x, y = getattr(self, f"x_{split}"), getattr(self, f"y_{split}")
            if (x.dtype not in INPUT_DTYPES and x.dtype.names is None) or not x.flags.c_contiguous:
                layout = "C-contiguous" if x.flags.c_contiguous else "not C-contiguous"
                raise ConfigError(
                    f"{where}: x_{split} must be C-contiguous float32 or int64 (or a structured"
                    f" array), got {layout} {x.dtype}"
                )
            if x.shape[1:] != tuple(self.input_shape):
                raise ConfigError(
                    f"{where}: x_{split} has rows of shape {x.shape[1:]},"
                    f" but input_shape is {self.input_shape}"
                )
            if y.dtype not in TARGET_DTYPES or y.ndim < 1 or len(y) != len(x):
                raise ConfigError(
                    f"{where}: y_{split} must be int64 or float32 with {len(x)} rows,"
                    f" got {y.dtype} {y.shape}"
                )
            if len(x) == 0:
                raise ConfigError(f"{where}: x_{split} has no rows")
            if y.dtype == np.int64 and not class_targets_fit(y, self.num_classes):
                raise ConfigError(f"{where}: y_{split} has labels outside [0, {self.num_classes})")
        if self.w_train is not None:
            check_weights(self.w_train, len(self.x_train), where)


def check_weights(w: np.ndarray, rows: int, where: str) -> None:
    """Sample weights as the loss takes them: one finite float32 >= 0 per row."""
    if w.dtype != np.float32 or w.shape != (rows,):
        raise ConfigError(
            f"{where}: weights must be float32 of shape ({rows},), got {w.dtype} {w.shape}"
        )
    if not np.isfinite(w).all() or (w < 0).any():
        raise ConfigError(f"{where}: weights must be finite and >= 0")


INPUT_DTYPES = (np.dtype(np.float32), np.dtype(np.int64))
TARGET_DTYPES = (np.dtype(np.int64), np.dtype(np.float32))
IGNORED_CLASS = -100  # a class target cross-entropy skips (a padded token)


def class_targets_fit(y: np.ndarray, num_classes: int) -> bool:
    """Whether every class target is in [0, num_classes) or the ignored one."""
    counted = y[y != IGNORED_CLASS] if y.ndim > 1 or y.min() < 0 else y
    return counted.size == 0 or (counted.min() >= 0 and counted.max() < num_classes)


def output_width(y_train: np.ndarray, y_test: np.ndarray) -> int:
    """The model's output width for these targets: classes (at least 2) for class indices,
    values per row for floats."""
    if y_train.dtype.kind == "f":
        return max(1, int(np.prod(y_train.shape[1:], dtype=np.int64)))
    return max(2, int(max(y_train.max(), y_test.max())) + 1)


def shard_indices(n: int, rank: int, world: int) -> np.ndarray:
    """Rows worker `rank` of `world` trains on: a contiguous int64 range of exactly n // world rows.

    Shards are disjoint and equal-sized so synchronous strategies take the same number of steps on
    every worker; the last n % world rows are dropped.
    """
    if world < 1:
        raise ConfigError(f"world must be >= 1, got {world}")
    if not 0 <= rank < world:
        raise ConfigError(f"rank must be in [0, {world}), got {rank}")
    if n < world:
        raise ConfigError(
            f"cannot split {n} rows over {world} workers: each needs at least one row"
        )
    per = n // world
    return np.arange(rank * per, (rank + 1) * per, dtype=np.int64)
