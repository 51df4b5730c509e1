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
from ember.data.dataset import Dataset
from ember.data.datasets import load_dataset, synthetic_model
from ember.data.idx import MNIST_DIR, find_idx_files
from ember.data.store import DataFiles, NpyWriter, scratch_root, write_files, write_meta

_IDX_NAMED = {"mnist": (None, None), "digits": (10_000, 2_000)}  # rows, as load_dataset has them
_BLOCK_BYTES = 4 << 20  # what synthetic-lr is written in: a few MB at a time
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


def host_data(
    spec: str,
    *,
    seed: int,
    synthetic_samples: int,
    synthetic_features: int,
    targets: str | None = "classes",
) -> HostData:
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
    # a user's file: read once, here, its targets as the loss takes them
    return host_dataset(load_dataset(spec, seed=seed, targets=targets))


def host_dataset(data: Dataset) -> HostData:
    """A dataset already in memory, laid out once for this host's processes to map."""
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


def _scratch(needed: int, on_disk: bool = False) -> Path:
    """A fresh folder for this run's copy, after removing those of launchers that died: in
    shared memory when it has room for `needed` bytes, unless `on_disk`."""
    root = None if on_disk else scratch_root(needed)
    base = Path(root) if root is not None else Path(tempfile.gettempdir())
    for old in base.glob(f"{_SCRATCH_PREFIX}*"):
        pid = old.name[len(_SCRATCH_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            with contextlib.suppress(OSError):
                shutil.rmtree(old)
    return Path(tempfile.mkdtemp(prefix=f"{_SCRATCH_PREFIX}{os.getpid()}-", dir=base))


def _write_synthetic(folder: Path, seed: int, samples: int, features: int) -> DataFiles:
    """load_dataset("synthetic-lr", ...)'s very arrays (the same draws in the same order),
    written block by block: no matrix is ever whole in this process's memory."""
    rng, w, b = synthetic_model(seed, samples, features)
    block_rows = max(1, _BLOCK_BYTES // (4 * features))
    logits = {}
    for split, rows in (("train", samples), ("test", max(1000, samples // 10))):
        writer = NpyWriter(folder / f"x_{split}.npy", np.dtype(np.float32), (rows, features))
        block = np.empty((min(block_rows, rows), features), dtype=np.float32)
        logits[split] = np.empty(rows, dtype=np.float32)  # x @ w, as _bernoulli_labels has it
        for start in range(0, rows, block_rows):
            part = block[: min(block_rows, rows - start)]
            rng.standard_normal(out=part, dtype=np.float32)
            logits[split][start : start + len(part)] = part @ w
            writer.write(part)
        writer.close()
    for split, logit in logits.items():  # the uniforms of the training labels, then the test's
        writer = NpyWriter(folder / f"y_{split}.npy", np.dtype(np.int64), (len(logit),))
        for start in range(0, len(logit), _BLOCK_BYTES // 8):
            part = logit[start : start + _BLOCK_BYTES // 8].astype(np.float64)
            p = 1.0 / (1.0 + np.exp(-part - b))
            writer.write((p > rng.random(len(part))).astype(np.int64))
        writer.close()
    write_meta(folder, "synthetic-lr", 2, (features,))
    return DataFiles.open(folder)


__all__ = ["HostData", "host_data"]
