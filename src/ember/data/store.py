"""One copy of the training data per host: .npy files written once (or found in the cache),
which every process maps instead of loading, a worker only its own rows and read-only."""

from __future__ import annotations

import json
import math
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

import numpy as np

from ember.data.dataset import Dataset, shard_indices
from ember.errors import ConfigError

RELEASE_BYTES = 32 << 20  # MappedRows lets go of the pages it read after this many
SPLITS = ("x_train", "y_train", "x_test", "y_test")
META = "meta.json"
Mode = Literal["r", "c"]  # how a mapping may be written to: never, or privately


@dataclass(frozen=True)
class ArrayFile:
    """A C-order .npy file by its header: where its rows start and what they hold."""

    path: str
    descr: Any  # the header's dtype description: a string, or a list for a structured array
    shape: tuple[int, ...]
    offset: int  # bytes of header before the first row

    @classmethod
    def open(cls, path: str | Path) -> ArrayFile:
        """Read a .npy file's header, checking the file holds every byte it announces."""
        path = Path(path)
        try:
            with path.open("rb") as f:
                version = np.lib.format.read_magic(f)
                read = (
                    np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0
                )
                shape, fortran, dtype = read(f)
                offset = f.tell()
            size = path.stat().st_size
        except (OSError, ValueError) as exc:
            raise ConfigError(f"array file {path}: cannot read its header ({exc})") from exc
        if fortran or dtype.hasobject:
            raise ConfigError(f"array file {path}: not a C-order array of numbers")
        expected = offset + math.prod(shape) * dtype.itemsize
        if size != expected:
            raise ConfigError(f"array file {path}: has {size} bytes, its header says {expected}")
        descr = np.lib.format.dtype_to_descr(dtype)
        return cls(str(path), descr, tuple(int(d) for d in shape), offset)

    @property
    def dtype(self) -> np.dtype:
        return np.lib.format.descr_to_dtype(self.descr)

    @property
    def row_bytes(self) -> int:
        return math.prod(self.shape[1:]) * self.dtype.itemsize

    def rows(self, start: int, stop: int, mode: Mode = "r") -> np.ndarray:
        """Rows [start, stop) mapped from the file, and nothing else of it: "r" read-only,
        "c" copy-on-write (writes stay in this process)."""
        if not 0 <= start < stop <= self.shape[0]:
            raise ConfigError(f"array file {self.path}: rows [{start}, {stop}) out of range")
        return np.memmap(
            self.path,
            dtype=self.dtype,
            mode=mode,
            offset=self.offset + start * self.row_bytes,
            shape=(stop - start, *self.shape[1:]),
        )

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) read into memory of this process's own, not mapped: reading a
        file through in windows then holds one window at a time."""
        if not 0 <= start < stop <= self.shape[0]:
            raise ConfigError(f"array file {self.path}: rows [{start}, {stop}) out of range")
        count = (stop - start) * math.prod(self.shape[1:])
        offset = self.offset + start * self.row_bytes
        rows = np.fromfile(self.path, dtype=self.dtype, count=count, offset=offset)
        return rows.reshape(stop - start, *self.shape[1:])


@dataclass(frozen=True)
class DataFiles:
    """A dataset laid out as four .npy files (rows beyond the limits are not part of it);
    small enough to hand to every worker, which maps what it needs."""

    name: str
    arrays: dict[str, ArrayFile]
    train_rows: int
    test_rows: int
    num_classes: int
    input_shape: tuple[int, ...]

    @classmethod
    def open(cls, folder: Path, name: str | None = None) -> DataFiles:
        """The files `write_files` left in `folder`."""
        try:
            meta = json.loads((folder / META).read_text())
            arrays = {key: ArrayFile.open(folder / f"{key}.npy") for key in SPLITS}
            return cls(
                name or str(meta["name"]),
                arrays,
                arrays["x_train"].shape[0],
                arrays["x_test"].shape[0],
                int(meta["num_classes"]),
                tuple(int(d) for d in meta["input_shape"]),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"data folder {folder}: unreadable ({exc})") from exc

    def limited(self, name: str, train_rows: int | None, test_rows: int | None) -> DataFiles:
        """The same files, as a dataset of their first rows only."""
        train = self.train_rows if train_rows is None else min(train_rows, self.train_rows)
        test = self.test_rows if test_rows is None else min(test_rows, self.test_rows)
        return DataFiles(name, self.arrays, train, test, self.num_classes, self.input_shape)

    def dataset(self, mode: Mode = "r") -> Dataset:
        """The whole dataset, mapped: no byte is read until it is used."""
        return self._dataset(0, self.train_rows, mode)

    def shard(self, rank: int, world: int) -> Dataset:
        """Worker `rank`'s training rows of `world` (see shard_indices), mapped read-only and
        alone: the other shards are not mapped at all. The test rows are mapped whole."""
        rows = shard_indices(self.train_rows, rank, world)
        return self._dataset(int(rows[0]), int(rows[-1]) + 1, "r")

    def test_batches(self, rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The test set as (x, y) windows of `rows` rows, each read when it is reached."""
        x, y = self.arrays["x_test"], self.arrays["y_test"]
        for start in range(0, self.test_rows, rows):
            stop = min(start + rows, self.test_rows)
            yield x.read(start, stop), y.read(start, stop)

    def _dataset(self, start: int, stop: int, mode: Mode) -> Dataset:
        a = self.arrays
        return Dataset(
            self.name,
            a["x_train"].rows(start, stop, mode),
            a["y_train"].rows(start, stop, mode),
            a["x_test"].rows(0, self.test_rows, mode),
            a["y_test"].rows(0, self.test_rows, mode),
            self.num_classes,
            self.input_shape,
        )


class NpyWriter:
    """Writes a .npy file of a known shape row block by row block, so that the writer never
    holds more than one block (a mapping it wrote through would count as its memory)."""

    def __init__(self, path: Path, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.path, self.dtype, self.shape = path, np.dtype(dtype), shape
        self.written = 0
        self._file: BinaryIO = path.open("wb")
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False}
        np.lib.format.write_array_header_1_0(self._file, {**header, "shape": shape})

    def write(self, block: np.ndarray) -> None:
        block = np.ascontiguousarray(block, dtype=self.dtype)
        if block.shape[1:] != self.shape[1:] or self.written + len(block) > self.shape[0]:
            raise ValueError(f"{self.path}: block of shape {block.shape} does not fit")
        self._file.write(block.data)
        self.written += len(block)

    def close(self) -> ArrayFile:
        self._file.close()
        if self.written != self.shape[0]:
            raise ValueError(f"{self.path}: {self.written} of {self.shape[0]} rows written")
        return ArrayFile.open(self.path)


def write_array(path: Path, array: np.ndarray, block_rows: int = 65536) -> ArrayFile:
    writer = NpyWriter(path, array.dtype, array.shape)
    for start in range(0, len(array), block_rows):
        writer.write(array[start : start + block_rows])
    return writer.close()


def write_meta(folder: Path, name: str, num_classes: int, input_shape: tuple[int, ...]) -> None:
    meta = {"name": name, "num_classes": num_classes, "input_shape": list(input_shape)}
    (folder / META).write_text(json.dumps(meta) + "\n")


def write_files(data: Dataset, folder: Path) -> DataFiles:
    """Lay `data` out in `folder` (created), once, for every process to map."""
    folder.mkdir(parents=True, exist_ok=True)
    for key in SPLITS:
        write_array(folder / f"{key}.npy", getattr(data, key))
    write_meta(folder, data.name, data.num_classes, data.input_shape)
    return DataFiles.open(folder)


def scratch_root(needed: int) -> Path | None:
    """Where a run's own copy of its data goes: shared memory when it has the room (the copy
    is then never written to a disk), else the temporary directory (None: the default)."""
    shm = Path("/dev/shm")
    try:
        stat = os.statvfs(shm)
    except OSError:
        return None
    room = stat.f_bavail * stat.f_frsize
    return shm if room > 2 * needed + (256 << 20) else None


class MappedRows:
    """An .npy file's rows mapped whole (address space, not memory) and gathered by number.
    The pages a gather maps stay the process's until it lets them go, so every RELEASE_BYTES
    gathered it does (madvise DONTNEED: the file's pages stay in the page cache, a later
    gather maps them again): what a worker holds of the file stays bounded by that, not by
    the shard."""

    def __init__(self, path: str) -> None:
        source = ArrayFile.open(path)
        with open(path, "rb") as file:
            self.map = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        count = math.prod(source.shape)
        self.rows = np.frombuffer(
            self.map, dtype=source.dtype, count=count, offset=source.offset
        ).reshape(source.shape)
        self.row_bytes, self.gathered = max(1, source.row_bytes), 0

    def take(self, numbers: np.ndarray) -> np.ndarray:
        rows = self.rows[numbers]  # a copy of this process's own
        self.gathered += len(numbers) * self.row_bytes
        if self.gathered >= RELEASE_BYTES:
            self.map.madvise(mmap.MADV_DONTNEED)
            self.gathered = 0
        return rows


__all__ = [
    "ArrayFile",
    "DataFiles",
    "MappedRows",
    "NpyWriter",
    "scratch_root",
    "write_array",
    "write_files",
]
