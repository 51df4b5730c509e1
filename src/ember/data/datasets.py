"""The datasets ember trains on: named ones, .npz/.parquet/IDX files, and per-worker shards."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from ember.data.cache import cached_idx
from ember.data.dataset import (
    Dataset,
    output_width,
)
from ember.data.files import load_npz, load_parquet
from ember.data.idx import MNIST_DIR, find_idx_files, load_idx_folder, normalize_images
from ember.errors import ConfigError

_DIGITS_ROWS = (10_000, 2_000)  # digits: the first train and test MNIST images
_SIGNAL = 4.0  # synthetic-lr: std of the true logit; Bayes accuracy is then about 0.87
_FILE_KINDS = ".npz, .parquet file or an MNIST IDX folder"


def load_dataset(
    spec: str,
    *,
    seed: int = 0,
    synthetic_samples: int = 100_000,
    synthetic_features: int = 100,
    targets: str | None = "classes",
) -> Dataset:
    """Load a named dataset (see DATASET_NAMES) or a .npz file, .parquet file/folder or IDX folder.

    mnist: the vendored 60,000/10,000 images, scaled to [0, 1] then normalized with mean 0.1307
    and std 0.3081, shape (n, 1, 28, 28). digits: the first 10,000 training and 2,000 test MNIST
    images, a quick smoke-test dataset. synthetic-lr: seeded binary logistic-regression data,
    `synthetic_samples` training rows of `synthetic_features` N(0, 1) features plus a test set of
    max(1000, n // 10) rows. Files without a test split hold out their last max(1, n // 10) rows.
    """
    named = _NAMED.get(spec)
    if named is not None:
        return named(seed, synthetic_samples, synthetic_features)

    path = Path(spec).expanduser()
    if not spec:  # Path("") is the working directory, which nobody means by an empty spec
        raise ConfigError(_unknown_data(spec))
    if path.is_dir():
        if find_idx_files(path):
            return _from_idx(str(path), path, None, None)
        if any(path.rglob("*.parquet")):
            return load_parquet(path, targets)
        raise ConfigError(
            f"data path {path}: folder holds neither MNIST IDX files nor .parquet files"
        )
    if path.is_file():
        if path.suffix == ".npz":
            return load_npz(path, targets)
        if path.suffix == ".parquet":
            return load_parquet(path, targets)
        raise ConfigError(
            f"data path {path}: unsupported file type {path.suffix!r}; expected .npz or .parquet"
        )
    if path.suffix in (".npz", ".parquet") or "/" in spec or "\\" in spec:
        raise ConfigError(f"data path {path}: no such file or directory")
    raise ConfigError(_unknown_data(spec))


def _unknown_data(spec: str) -> str:
    return (
        f"data must be one of {', '.join(DATASET_NAMES)} or a path to a {_FILE_KINDS}; got {spec!r}"
    )


def train_pixels(data: Dataset) -> np.ndarray | None:
    """The uint8 images (n, rows, cols) that `data.x_train` was normalized from, for a dataset
    read from IDX files (mnist, digits, an IDX folder); None for any other. A quarter of the
    bytes of the floats, for engines that ship the training split elsewhere."""
    if data.name in ("mnist", "digits"):
        rows = None if data.name == "mnist" else _DIGITS_ROWS[0]
        pixels = load_idx_folder(MNIST_DIR)["x_train"][:rows]
    elif Path(data.name).is_dir() and find_idx_files(Path(data.name)):
        pixels = load_idx_folder(data.name)["x_train"]
    else:
        return None
    # the caller may have changed the floats since loading: use the bytes only if they still match
    if len(pixels) != len(data.x_train) or data.x_train.shape[1:] != (1, *pixels.shape[1:]):
        return None
    head = slice(0, min(64, len(pixels)))
    if not np.array_equal(normalize_images(pixels[head]), data.x_train[head]):
        return None
    return pixels


def scored_rows(data: Dataset, whole: bool) -> tuple[np.ndarray, np.ndarray, str]:
    """The rows to score a model on, and which they are: the test split; of a file without
    one, the whole file when `whole` (a file of new rows), else the last rows held out."""
    if not data.held_out:
        return data.x_test, data.y_test, "test split"
    if whole:
        x = np.concatenate([data.x_train, data.x_test])
        return x, np.concatenate([data.y_train, data.y_test]), "whole file (it has no test split)"
    held = len(data.x_test)
    return data.x_test, data.y_test, f"last {held} rows, held out in training (no test split)"


def check_shards(name: str, rows: tuple[int, int], workers: int, batch_size: int) -> None:
    """Refuse, before anything starts, data `name` whose (training, test) `rows` are too few
    for each of `workers` to train on one batch of `batch_size` (rows // workers each)."""
    train, test = rows
    if train // workers < batch_size:
        each = f"each of {workers} workers" if workers > 1 else "its 1 worker"
        raise ConfigError(
            f"data {name}: {train} training rows (besides {test} test row{'s' * (test != 1)})"
            f" cannot give {each}"
            f" one batch of {batch_size} rows ({workers * batch_size} rows at least); lower"
            " --workers or --batch-size"
        )


def _mnist(seed: int, samples: int, features: int) -> Dataset:
    return _from_idx("mnist", MNIST_DIR, None, None)


def _digits(seed: int, samples: int, features: int) -> Dataset:
    return _from_idx("digits", MNIST_DIR, *_DIGITS_ROWS)


def _from_idx(name: str, folder: Path, train_rows: int | None, test_rows: int | None) -> Dataset:
    cached = cached_idx(folder)
    if cached is not None:  # mapped copy-on-write: the caller may still write to the arrays
        return cached.limited(name, train_rows, test_rows).dataset(mode="c")
    raw = load_idx_folder(folder)
    x_train, x_test = (
        normalize_images(raw[k][:n]) for k, n in (("x_train", train_rows), ("x_test", test_rows))
    )
    y_train, y_test = (
        raw[k][:n].astype(np.int64) for k, n in (("y_train", train_rows), ("y_test", test_rows))
    )
    num_classes = output_width(y_train, y_test)
    return Dataset(name, x_train, y_train, x_test, y_test, num_classes, x_train.shape[1:])


def synthetic_model(
    seed: int, samples: int, features: int
) -> tuple[np.random.Generator, np.ndarray, float]:
    """synthetic-lr's checked sizes, then its generator after drawing the true weights and bias:
    every writer of the task draws the rows from it next, in the same order."""
    for name, value in (("synthetic_samples", samples), ("synthetic_features", features)):
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    rng = np.random.default_rng(seed)
    g = rng.standard_normal(features)
    # w is N(0, 1)/sqrt(d) direction-wise but rescaled to norm _SIGNAL, so x @ w ~ N(0, _SIGNAL^2)
    # for every d and seed and the task is equally hard (learnable, Bayes accuracy ~0.87) for all
    w = (_SIGNAL * g / np.linalg.norm(g)).astype(np.float32)
    return rng, w, float(rng.normal(0.0, 0.5))


def _synthetic_lr(seed: int, samples: int, features: int) -> Dataset:
    rng, w, b = synthetic_model(seed, samples, features)
    x_train = _gaussian(rng, samples, features)
    x_test = _gaussian(rng, max(1000, samples // 10), features)
    y_train = _bernoulli_labels(rng, x_train, w, b)
    y_test = _bernoulli_labels(rng, x_test, w, b)
    return Dataset("synthetic-lr", x_train, y_train, x_test, y_test, 2, (features,))


def _gaussian(rng: np.random.Generator, rows: int, features: int) -> np.ndarray:
    x = np.empty((rows, features), dtype=np.float32)
    # filled in place in float32: no float64 copy of the matrix ever exists
    rng.standard_normal(out=x, dtype=np.float32)
    return x


def _bernoulli_labels(
    rng: np.random.Generator, x: np.ndarray, w: np.ndarray, b: float
) -> np.ndarray:
    p = 1.0 / (1.0 + np.exp(-(x @ w).astype(np.float64) - b))
    return (p > rng.random(len(x))).astype(np.int64)


_NAMED: dict[str, Callable[[int, int, int], Dataset]] = {
    "mnist": _mnist,
    "digits": _digits,
    "synthetic-lr": _synthetic_lr,
}
DATASET_NAMES = tuple(_NAMED)
