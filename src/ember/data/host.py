"""The launcher's one copy of a run's data on this host: the IDX cache's files for MNIST-style
data, else files it writes once (synthetic-lr block by block, a user's file after one read)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ember.data.cache import cached_idx
from ember.data.datasets import _SIGNAL, _bernoulli_labels, load_dataset
from ember.data.idx import MNIST_DIR, find_idx_files
from ember.data.store import (
    DataFiles,
    NpyWriter,
    scratch_root,
    write_array,
    write_files,
    write_meta,
)
from ember.errors import ConfigError

_IDX_NAMED = {"mnist": (None, None), "digits": (10_000, 2_000)}  # rows, as load_dataset has them
_BLOCK_ROWS = 65536
_SCRATCH_PREFIX = "ember-data-"


@dataclass
class HostData:
    """The files and, when this run wrote them, the folder to remove once it ends."""

    files: DataFiles
    scratch: Path | None = None

    def close(self) -> None:
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None


def host_data(spec: str, *, seed: int, synthetic_samples: int, synthetic_features: int) -> HostData:
    """`spec` (as load_dataset takes it) laid out once for this host's processes to map."""
    folder = _idx_folder(spec)
    if folder is not None:
        files = cached_idx(folder)
        if files is not None:
            rows = _IDX_NAMED.get(spec, (None, None))
            return HostData(files.limited(spec, *rows))
    if spec == "synthetic-lr":
        needed = synthetic_samples * (synthetic_features * 4 + 8) * 11 // 10
        scratch = _scratch(needed)
        try:
            return HostData(
                _write_synthetic(scratch, seed, synthetic_samples, synthetic_features), scratch
            )
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
    data = load_dataset(spec, seed=seed)  # a user's file: read this once, here
    needed = sum(getattr(data, k).nbytes for k in ("x_train", "y_train", "x_test", "y_test"))
    scratch = _scratch(needed)
    try:
        return HostData(write_files(data, scratch), scratch)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise


def _idx_folder(spec: str) -> Path | None:
    if spec in _IDX_NAMED:
        return MNIST_DIR
    path = Path(spec).expanduser()
    return path if spec and path.is_dir() and find_idx_files(path) else None


def _scratch(needed: int) -> Path:
    """A fresh folder for this run's copy, after removing those of launchers that died."""
    root = scratch_root(needed)
    base = Path(root) if root is not None else Path(tempfile.gettempdir())
    for old in base.glob(f"{_SCRATCH_PREFIX}*"):
        pid = old.name[len(_SCRATCH_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            with contextlib.suppress(OSError):
                shutil.rmtree(old)
    return Path(tempfile.mkdtemp(prefix=f"{_SCRATCH_PREFIX}{os.getpid()}-", dir=base))


def _write_synthetic(folder: Path, seed: int, samples: int, features: int) -> DataFiles:
    """load_dataset("synthetic-lr", ...)'s very arrays (the same draws in the same order),
    written block by block: the training matrix is never whole in this process's memory."""
    from ember.data.datasets import _synthetic_lr

    if samples * features <= _BLOCK_ROWS * 8:  # small: the plain way is quicker
        return write_files(_synthetic_lr(seed, samples, features), folder)
    for name, value in (("synthetic_samples", samples), ("synthetic_features", features)):
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    rng = np.random.default_rng(seed)
    g = rng.standard_normal(features)
    w = (_SIGNAL * g / np.linalg.norm(g)).astype(np.float32)
    b = float(rng.normal(0.0, 0.5))
    block = np.empty((min(_BLOCK_ROWS, samples), features), dtype=np.float32)
    writer = NpyWriter(folder / "x_train.npy", np.dtype(np.float32), (samples, features))
    logits = np.empty(samples, dtype=np.float64)
    for start in range(0, samples, _BLOCK_ROWS):
        rows = block[: min(_BLOCK_ROWS, samples - start)]
        rng.standard_normal(out=rows, dtype=np.float32)
        logits[start : start + len(rows)] = rows @ w
        writer.write(rows)
    writer.close()
    x_test = np.empty((max(1000, samples // 10), features), dtype=np.float32)
    rng.standard_normal(out=x_test, dtype=np.float32)
    # as _bernoulli_labels draws them: the training labels' uniforms, then the test labels'
    p = 1.0 / (1.0 + np.exp(-logits - b))
    write_array(folder / "y_train.npy", (p > rng.random(samples)).astype(np.int64))
    write_array(folder / "y_test.npy", _bernoulli_labels(rng, x_test, w, b))
    write_array(folder / "x_test.npy", x_test)
    write_meta(folder, "synthetic-lr", 2, (features,))
    return DataFiles.open(folder)


__all__ = ["HostData", "host_data"]
