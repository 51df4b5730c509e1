"""Decoded IDX folders (MNIST) kept as .npy files, so a gzip is inflated and its images
normalized once per machine, not once per process; a changed source file is a new entry."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from ember.data.idx import find_idx_files, load_idx_folder, normalize_images
from ember.data.store import DataFiles, write_array, write_meta
from ember.errors import ConfigError

FORMAT = 1  # bump when what an entry holds changes: older entries are then never read


def cache_root() -> Path:
    """EMBER_CACHE_DIR, else $XDG_CACHE_HOME/ember, else ~/.cache/ember."""
    explicit = os.environ.get("EMBER_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ember"


def cached_idx(folder: str | Path) -> DataFiles | None:
    """The folder's four IDX arrays decoded (images normalized to float32, labels int64),
    from the cache or decoded into it now; None when the cache cannot be written here."""
    folder = Path(folder).resolve()
    files = find_idx_files(folder)
    if len(files) < 4:
        load_idx_folder(folder)  # raises the one error naming what is missing
    stamp = repr(
        (
            FORMAT,
            sorted((k, p.name, p.stat().st_size, p.stat().st_mtime_ns) for k, p in files.items()),
        )
    )
    source = hashlib.sha256(str(folder).encode()).hexdigest()[:12]
    entry = cache_root() / f"idx-{source}-{hashlib.sha256(stamp.encode()).hexdigest()[:12]}"
    if entry.is_dir():
        try:
            return DataFiles.open(entry)
        except ConfigError:  # damaged (a full disk, a hand edit): decoded again below
            shutil.rmtree(entry, ignore_errors=True)
    try:
        return _decode_into(folder, entry)
    except OSError:
        return None


def _decode_into(folder: Path, entry: Path) -> DataFiles:
    raw = load_idx_folder(folder)
    entry.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    try:
        for split in ("train", "test"):
            write_array(building / f"x_{split}.npy", normalize_images(raw[f"x_{split}"]))
            write_array(building / f"y_{split}.npy", raw[f"y_{split}"].astype(np.int64))
        classes = int(max(raw["y_train"].max(), raw["y_test"].max())) + 1
        write_meta(building, str(folder), max(2, classes), (1, *raw["x_train"].shape[1:]))
        try:
            building.rename(entry)  # whole or not at all, for a process reading it meanwhile
        except OSError:
            if not entry.is_dir():  # not a concurrent run having made the same entry
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    # the entries of this folder's older contents are of no further use
    prefix = entry.name.rsplit("-", 1)[0] + "-"
    for stale in entry.parent.glob(f"{prefix}*"):
        if stale != entry and not stale.name.startswith("."):
            shutil.rmtree(stale, ignore_errors=True)
    return DataFiles.open(entry)


__all__ = ["cache_root", "cached_idx"]
