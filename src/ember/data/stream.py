"""Training rows that stay on disk: a plan of pieces (Parquet row groups, windows of .npy rows,
.npz shards), split evenly among workers and read one piece at a time, each problem one
ConfigError naming the file and the piece.

imports: numpy, pyarrow (lazily), ember.errors and the data part
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ember.data.arrow import values_like
from ember.data.dataset import Dataset
from ember.data.files import _validated, parquet_columns
from ember.data.store import ArrayFile
from ember.errors import ConfigError

# An .npy piece. Its rows are gathered by number from the file's mapping (streaming.py), so a
# piece costs nothing held: small ones, in a fresh order each epoch, spread a batch's rows
# over the whole shard before the shuffle buffer mixes them.
WINDOW_BYTES = 1 << 20
NPZ_KEYS = ("x", "y")  # the arrays of one .npz shard


@dataclass(frozen=True)
class Piece:
    """Rows [start, stop) of one unit of reading: a Parquet row group (rows counted within
    it), an .npy window (rows of the file) or a whole .npz shard."""

    kind: str  # "parquet" | "npy" | "npz" | "ipc" (a Spark task's spill: Arrow record batches)
    path: str  # the features' file
    index: int  # row group, or window number: what an error names
    start: int
    stop: int
    labels: str = ""  # npy: the labels' file

    @property
    def rows(self) -> int:
        return self.stop - self.start

    @property
    def where(self) -> str:
        unit = {"parquet": "row group", "npy": "rows from", "ipc": "batch"}.get(self.kind)
        what = "spilled partition" if self.kind == "ipc" else "data file"
        if unit is None:
            return f"{what} {self.path}"
        at = self.start if self.kind == "npy" else self.index
        return f"{what} {self.path}, {unit} {at}"


@dataclass(frozen=True)
class StreamPlan:
    """A dataset's training (or test) rows as pieces in file order; small enough to hand to
    every worker, each of which reads only its share."""

    pieces: tuple[Piece, ...]
    input_shape: tuple[int, ...]
    num_classes: int  # the model's output width: classes, or values a row
    targets: str = "classes"  # as objective.targets_of: classes, or values / binary (floats)
    target_shape: tuple[int, ...] = ()  # one row's targets: () for a class or a number

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.pieces)

    def split(self, cut: int) -> tuple[StreamPlan, StreamPlan]:
        """The first `cut` rows in file order, and the rest."""
        return replace(self, pieces=_window(self.pieces, 0, cut)), replace(
            self, pieces=_window(self.pieces, cut, self.rows)
        )

    def shard(self, rank: int, world: int, seed: int) -> tuple[Piece, ...]:
        """Worker `rank`'s pieces of `world`: the pieces in an order fixed by `seed` (so that
        a file sorted by label is not cut into one label per worker), then cut into `world`
        runs of exactly rows // world rows, as shard_indices cuts rows held in memory."""
        if self.rows < world:
            raise ConfigError(f"cannot split {self.rows} rows over {world} workers")
        order = np.random.default_rng([seed, 0x5EED]).permutation(len(self.pieces))
        per = self.rows // world
        return _window(tuple(self.pieces[i] for i in order), rank * per, (rank + 1) * per)


def _window(pieces: tuple[Piece, ...], lo: int, hi: int) -> tuple[Piece, ...]:
    """Rows [lo, hi) of `pieces` laid end to end, the pieces at either edge clipped."""
    kept, offset = [], 0
    for piece in pieces:
        first, last = max(lo, offset), min(hi, offset + piece.rows)
        if first < last:
            start = piece.start + first - offset
            kept.append(replace(piece, start=start, stop=start + last - first))
        offset += piece.rows
    return tuple(kept)


def plan_files(path: Path, targets: str | None = "classes") -> StreamPlan:
    """A Parquet file or folder, or a folder of .npz shards: its rows as pieces, from the
    files' metadata (and the first piece's width), with targets as the loss takes them."""
    if path.is_file() and path.suffix == ".parquet":
        return _plan_parquet([path], targets)
    if path.is_dir():
        parquet = _listed(path, ".parquet")
        if parquet:
            return _plan_parquet(parquet, targets)
        npz = _listed(path, ".npz")
        if npz:
            return _plan_npz(npz, targets)
    raise ConfigError(
        f"data path {path}: cannot be streamed; expected a .parquet file or a folder of"
        " .parquet or .npz files"
    )


def _listed(folder: Path, suffix: str) -> list[Path]:
    """Data files under `folder` in path order; Spark's _SUCCESS and .crc files are not."""
    found = sorted(p for p in folder.rglob(f"*{suffix}") if p.is_file())
    return [p for p in found if not p.name.startswith(("_", "."))]


def plan_npy(x: ArrayFile, y: ArrayFile, rows: int, num_classes: int) -> StreamPlan:
    """The first `rows` rows of an x/y pair of .npy files, in windows of about WINDOW_BYTES;
    float targets are values, as the loader wrote them for a loss on values."""
    step = max(1, WINDOW_BYTES // max(1, x.row_bytes))
    pieces = tuple(
        Piece("npy", x.path, start // step, start, min(start + step, rows), labels=y.path)
        for start in range(0, rows, step)
    )
    targets = "values" if np.dtype(y.dtype).kind == "f" else "classes"
    return StreamPlan(pieces, tuple(x.shape[1:]), num_classes, targets, tuple(y.shape[1:]))


def _plan_parquet(paths: list[Path], targets: str | None) -> StreamPlan:
    import pyarrow as pa  # lazily: slow to import, and most runs read no Parquet
    import pyarrow.parquet as pq

    pieces: list[Piece] = []
    top = 0
    for path in paths:
        try:
            meta = pq.ParquetFile(path).metadata
            names = meta.schema.to_arrow_schema().names
        except (pa.ArrowException, OSError) as exc:
            raise ConfigError(f"data file {path}: cannot read as Parquet ({exc})") from exc
        for column in ("features", "label"):
            if column not in names:
                raise ConfigError(
                    f"data file {path}: missing column {column!r} (found: {', '.join(names)})"
                )
        label = names.index("label")
        for group in range(meta.num_row_groups):
            rows = meta.row_group(group).num_rows
            if rows:
                pieces.append(Piece("parquet", str(path), group, 0, rows))
            if targets in ("values", "binary") or not rows:  # no classes to count
                continue
            stats = meta.row_group(group).column(label).statistics
            if stats is not None and stats.has_min_max:
                top = max(top, int(stats.max))
            else:  # no statistics: read this group's labels alone
                top = max(top, int(read_piece(pieces[-1])[1].max()))
    return _planned(pieces, top, paths, targets)


def _plan_npz(paths: list[Path], targets: str | None) -> StreamPlan:
    pieces, top = [], 0
    for path in paths:
        shapes = {key: _npz_shape(path, key) for key in NPZ_KEYS}
        per_row = shapes["y"][:1] == shapes["x"][:1] and (
            len(shapes["y"]) == 1 or targets != "classes"
        )
        if len(shapes["x"]) < 2 or not per_row:
            raise ConfigError(
                f"data file {path}: x must be (rows, features...) and y a target per row;"
                f" got x {shapes['x']}, y {shapes['y']}"
            )
        pieces.append(Piece("npz", str(path), 0, 0, shapes["x"][0]))
        if targets not in ("values", "binary"):
            top = max(top, int(read_piece(pieces[-1], targets=targets)[1].max()))  # small
    return _planned(pieces, top, paths, targets)


def _planned(pieces: list[Piece], top: int, paths: list[Path], targets: str | None) -> StreamPlan:
    """The plan of `pieces`: one row's shapes from the first, the output width from the
    classes seen (`top`, the largest label) or the values a row holds. A loss that takes
    its targets as they are (None) gets classes for integer labels, values for floats."""
    if not pieces:
        raise ConfigError(f"data files {', '.join(map(str, paths))}: no rows")
    x, y = read_piece(replace(pieces[0], stop=pieces[0].start + 1), targets=targets)
    kind = targets or ("classes" if y.dtype == np.int64 else "values")
    target_shape = tuple(y.shape[1:])
    width = max(2, top + 1) if kind == "classes" else max(1, int(np.prod(target_shape)))
    return StreamPlan(tuple(pieces), tuple(x.shape[1:]), width, kind, target_shape)


def _npz_shape(path: Path, key: str) -> tuple[int, ...]:
    """An array's shape from its header inside the archive, without reading its data."""
    try:
        with zipfile.ZipFile(path) as archive, archive.open(f"{key}.npy") as member:
            version = np.lib.format.read_magic(member)
            read = getattr(np.lib.format, f"read_array_header_{version[0]}_0")
            shape, _, dtype = read(member)
    except KeyError:
        raise ConfigError(f"data file {path}: an .npz shard holds arrays x and y") from None
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"data file {path}: cannot read array {key!r} ({exc})") from exc
    if dtype.hasobject:
        raise ConfigError(f"data file {path}: array {key!r} holds objects, not numbers")
    return tuple(int(d) for d in shape)


def read_piece(
    piece: Piece, shape: tuple[int, ...] | None = None, targets: str | None = "classes"
) -> tuple[np.ndarray, np.ndarray]:
    """The piece's rows as float32 features and their targets as the loss takes them (int64
    classes, float32 values); `shape` (one row's) is checked when given: a file whose width
    changed is an error. The rows may be read-only views of what was read."""
    with _naming(piece):
        if piece.kind == "parquet":
            x, y = _read_row_group(piece, targets)
        elif piece.kind == "ipc":
            x, y = _read_batch(piece, shape, targets)
        elif piece.kind == "npy":
            x = ArrayFile.open(piece.path).read(piece.start, piece.stop)
            y = ArrayFile.open(piece.labels).read(piece.start, piece.stop)
        else:
            with np.load(piece.path, allow_pickle=False) as archive:
                x, y = (archive[k][piece.start : piece.stop] for k in NPZ_KEYS)
    return _checked(piece, x, y, shape, targets)


def read_row_numbers(piece: Piece) -> tuple[np.ndarray, np.ndarray]:
    """An .npy piece's row numbers in its file and the rows' targets, without its features
    (which a mapped stream gathers by those numbers, one copy a row, as rows held in memory)."""
    if piece.kind != "npy":
        raise ValueError(f"{piece.where}: only an .npy piece is read by row numbers")
    with _naming(piece):
        y = ArrayFile.open(piece.labels).read(piece.start, piece.stop)
    if len(y) != piece.rows:
        raise ConfigError(f"{piece.where}: holds {len(y)} labels, not {piece.rows}")
    return np.arange(piece.start, piece.stop, dtype=np.int64), y


@contextmanager
def _naming(piece: Piece) -> Iterator[None]:
    """A problem reading `piece` as one ConfigError that names it."""
    try:
        yield
    except ConfigError as exc:
        raise ConfigError(f"{piece.where}: {exc}") from exc
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"{piece.where}: cannot read ({type(exc).__name__}: {exc})") from exc


def _read_row_group(piece: Piece, targets: str | None) -> tuple[np.ndarray, np.ndarray]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with pq.ParquetFile(piece.path) as source:
            # no pyarrow threads: this runs on a read-ahead thread beside the training step
            table = source.read_row_group(
                piece.index, columns=["features", "label"], use_threads=False
            )
        return parquet_columns(table.slice(piece.start, piece.rows), targets)
    except pa.ArrowException as exc:  # a truncated or corrupt file, found mid-stream
        raise ConfigError(f"cannot read as Parquet ({type(exc).__name__}: {exc})") from exc


def _read_batch(
    piece: Piece, shape: tuple[int, ...] | None, targets: str | None
) -> tuple[np.ndarray, np.ndarray]:
    """One record batch of a spill, mapped only while its rows are copied out."""
    import pyarrow as pa

    from ember.data.arrow import table_arrays  # the checked frame's layout

    if shape is None:
        raise ConfigError("a spilled partition is read with its rows' shape")
    try:
        with pa.memory_map(piece.path) as source:
            batch = pa.ipc.open_file(source).get_batch(piece.index)
            table = pa.Table.from_batches([batch]).slice(piece.start, piece.rows)
            like = _kinds_of(shape, targets, table)
            return table_arrays(table, shape, like)  # copies: nothing refers to the mapping after
    except pa.ArrowException as exc:
        raise ConfigError(f"cannot read ({type(exc).__name__}: {exc})") from exc


def _kinds_of(shape: tuple[int, ...], targets: str | None, table: Any) -> Dataset | None:
    """The kinds table_arrays converts a spill's rows to: None for class labels, else float32
    values as many a row as the label column holds."""
    import pyarrow as pa

    if targets == "classes":
        return None
    label = table.column("label").type
    width = label.list_size if pa.types.is_fixed_size_list(label) else 0
    if pa.types.is_list(label) and table.num_rows:
        width = len(table.column("label")[0])
    return values_like(shape, width)


def _checked(
    piece: Piece,
    x: np.ndarray,
    y: np.ndarray,
    shape: tuple[int, ...] | None,
    targets: str | None,
) -> tuple[np.ndarray, np.ndarray]:
    where = piece.where
    if shape is not None and tuple(x.shape[1:]) != tuple(shape):
        raise ConfigError(
            f"{where}: rows have shape {tuple(x.shape[1:])}, the rows before had {tuple(shape)}"
            " (the schema changed mid-stream)"
        )
    if len(x) != piece.rows or len(y) != piece.rows:
        raise ConfigError(f"{where}: holds {len(x)} rows and {len(y)} labels, not {piece.rows}")
    if piece.kind == "npy":  # ember's own layout: its rows were checked as they were written
        return x, y
    # as a file read whole is checked; a row is counted from the piece's first. The rows
    # may stay views of the piece's Arrow buffers: the shuffle pool copies them out.
    return _validated(where, x, y, "features", "labels", targets, views=True)


__all__ = ["Piece", "StreamPlan", "plan_files", "plan_npy", "read_piece", "read_row_numbers"]
