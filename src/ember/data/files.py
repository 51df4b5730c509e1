"""A user's data files: .npz archives and Parquet files or folders, read without pickle, each
problem one ConfigError naming the file and what is wrong (docs/data.md lists the layouts)."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ember.data.dataset import IGNORED_CLASS, Dataset, output_width
from ember.errors import ConfigError

NPZ_SPLIT = ("x_train", "y_train", "x_test", "y_test")  # an .npz with its own test split


ARRAYS = "arrays"  # the data a run on arrays the caller held names (summary, checkpoints)


def load_npz(path: Path, targets: str | None = "classes") -> Dataset:
    """x_train, y_train, x_test, y_test, or x and y (the last tenth held out for testing)."""
    where = f"data path {path}"
    # checked first because np.load reports any non-zip file as "pickled data"
    if not zipfile.is_zipfile(path):
        raise ConfigError(f"{where}: not an .npz (zip) archive")
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"{where}: cannot read ({exc})") from exc
    with archive:
        found = sorted(archive.files)
        wanted = NPZ_SPLIT if any(k in found for k in NPZ_SPLIT) else ("x", "y")
        for key in wanted:
            if key not in found:
                raise ConfigError(_missing_array(where, key, found))
        arrays = {}
        for key in wanted:
            try:
                arrays[key] = archive[key]
            except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
                raise ConfigError(f"{where}: cannot read array {key!r} ({exc})") from exc

    def pair(x: str, y: str) -> tuple[np.ndarray, np.ndarray]:
        return _validated(where, arrays[x], arrays[y], f"array {x!r}", f"array {y!r}", targets)

    if wanted == NPZ_SPLIT:
        return _make(str(path), where, *pair("x_train", "y_train"), *pair("x_test", "y_test"))
    return _make(str(path), where, *_hold_out(where, *pair("x", "y")), held_out=True)


def arrays_dataset(
    train: object,
    test: object | None,
    name: str = ARRAYS,
    targets: str | None = "classes",
) -> Dataset:
    """A Dataset of in-memory (features, labels) pairs, NumPy arrays or anything
    `np.asarray` takes (torch tensors on the CPU); without `test`, the last tenth of the
    training pair is held out. Checked as a file's arrays are; int64 inputs stay token ids,
    a dict of arrays becomes one structured array (the model's keyword arguments) and a
    map-style torch Dataset of (x, y) items is stacked."""
    where = f"data {name}"
    pairs = [("data", train)] + ([("test_data", test)] if test is not None else [])
    checked = []
    for what, pair in pairs:
        x, y = _pair(what, pair)
        checked.append(_validated(where, x, y, f"{what}'s x", f"{what}'s y", targets, ids=True))
    if test is None:
        return _make(name, where, *_hold_out(where, *checked[0]), held_out=True)
    return _make(name, where, *checked[0], *checked[1])


def _pair(what: str, given: object) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) of an (x, y) pair, x a dict of arrays or not, or a torch Dataset."""
    if (
        hasattr(given, "__getitem__")
        and hasattr(given, "__len__")
        and not isinstance(given, (tuple, list))
    ):
        given = _stacked(what, given)
    if not isinstance(given, (tuple, list)) or len(given) != 2:
        raise ConfigError(
            f"{what} must be a path, a dataset name, an (x, y) pair of arrays or a map-style"
            f" torch Dataset; got {type(given).__name__}"
        )
    x, y = given
    if isinstance(x, dict):
        return _structured(what, {str(k): np.asarray(_cpu(v)) for k, v in x.items()}), np.asarray(
            _cpu(y)
        )
    return np.asarray(_cpu(x)), np.asarray(_cpu(y))


def _stacked(what: str, dataset: Any) -> tuple[object, object]:
    """A map-style dataset's (x, y) items stacked into two arrays (dicts field by field)."""
    items = [dataset[i] for i in range(len(dataset))]
    if not items or not all(isinstance(i, (tuple, list)) and len(i) == 2 for i in items):
        raise ConfigError(f"{what}: a torch Dataset's items must be (x, y) pairs")
    xs, ys = [i[0] for i in items], np.stack([np.asarray(_cpu(i[1])) for i in items])
    if isinstance(xs[0], dict):
        return {k: np.stack([np.asarray(_cpu(x[k])) for x in xs]) for k in xs[0]}, ys
    return np.stack([np.asarray(_cpu(x)) for x in xs]), ys


def _structured(what: str, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """Several named inputs of equal rows as one structured array, a field each."""
    rows = {len(v) for v in inputs.values()}
    if len(rows) != 1:
        raise ConfigError(f"{what}: the arrays of its x dict have different row counts {rows}")
    fields = []
    for key, value in inputs.items():
        kind = np.int64 if value.dtype.kind in "iu" and value.dtype.itemsize >= 4 else np.float32
        fields.append((key, kind, value.shape[1:]))
    packed = np.zeros(rows.pop(), dtype=fields)
    for key, value in inputs.items():
        packed[key] = value
    return packed


def _cpu(value: object) -> object:
    """A torch tensor as NumPy can read it (detached, on the CPU); anything else as it is."""
    detach = getattr(value, "detach", None)
    return detach().cpu().numpy() if callable(detach) else value


def _missing_array(where: str, key: str, found: list[str]) -> str:
    accepted = f"{', '.join(NPZ_SPLIT)}, or x and y (the last tenth becomes the test set)"
    # X_train is not x_train: say so, since that is the usual slip
    miscased = any(n != n.lower() and n.lower() in (*NPZ_SPLIT, "x", "y") for n in found)
    hint = "; array names are case-sensitive" if miscased else ""
    return (
        f"{where}: missing array {key!r} (found: {', '.join(found) or 'no arrays'});"
        f" an .npz holds arrays {accepted}{hint}"
    )


def load_parquet(path: Path, targets: str | None = "classes") -> Dataset:
    """A file or folder of `features` (a list of numbers) and `label`; a folder holding
    train.parquet and test.parquet is that split, anything else has its last tenth held out."""
    train, test = path / "train.parquet", path / "test.parquet"
    if path.is_dir() and train.is_file() and test.is_file():
        read = _read_parquet(train, targets), _read_parquet(test, targets)
        return _make(str(path), f"data path {path}", *read[0], *read[1])
    where = f"data path {path}"
    pair = _read_parquet(path, targets)
    return _make(str(path), where, *_hold_out(where, *pair), held_out=True)


def _read_parquet(path: Path, targets: str | None = "classes") -> tuple[np.ndarray, np.ndarray]:
    """Read the `features` list column and `label` column of a file or folder, no per-row loop;
    a loss on values takes a `label` of numbers or of equal-length lists of them."""
    import pyarrow as pa  # lazily: pyarrow is slow to import and most runs use no Parquet
    import pyarrow.parquet as pq

    where = f"data path {path}"
    try:
        source = pq.ParquetDataset(path)
        found = source.schema.names
        for column in ("features", "label"):
            if column not in found:
                raise ConfigError(f"{where}: missing column {column!r} (found: {', '.join(found)})")
        table = source.read(columns=["features", "label"])
    except (pa.ArrowException, OSError) as exc:
        raise ConfigError(f"{where}: cannot read as Parquet ({exc})") from exc
    try:
        x, y = parquet_columns(table, targets)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return _validated(where, x, y, "column 'features'", "column 'label'", targets)


def parquet_columns(table: Any, targets: str | None = "classes") -> tuple[np.ndarray, np.ndarray]:
    """A table's `features` (a list of numbers) and `label` as arrays, their layout checked
    (errors name no file: the caller's place goes first); the values are checked by
    _validated. A loss on values takes a `label` of numbers or of equal-length lists. The
    arrays may be read-only views of the table's buffers."""
    import pyarrow as pa
    import pyarrow.compute as pc

    features, label = table.column("features"), table.column("label")
    ftype, ltype = features.type, label.type
    is_list = pa.types.is_list(ftype) or pa.types.is_large_list(ftype)
    if not (is_list or pa.types.is_fixed_size_list(ftype)):
        raise ConfigError(f"column 'features' must be a list of numbers, got {ftype}{_hint(ftype)}")
    if not (pa.types.is_integer(ftype.value_type) or pa.types.is_floating(ftype.value_type)):
        raise ConfigError(f"column 'features' must hold numbers, got {ftype}")
    listed = targets != "classes" and (
        pa.types.is_list(ltype) or pa.types.is_fixed_size_list(ltype)
    )
    if listed:
        lengths = pc.list_value_length(label).to_numpy(zero_copy_only=False)
        if label.null_count or len(set(lengths.tolist())) > 1:
            raise ConfigError("column 'label' holds lists of unequal lengths or nulls")
        label = pc.list_flatten(label)
    number = pa.types.is_integer(label.type) or pa.types.is_floating(label.type)
    if not (number or pa.types.is_boolean(label.type)):
        raise ConfigError(f"column 'label' must hold integer labels, got {ltype}")
    for name, column in (("features", features), ("label", label)):
        if column.null_count:
            raise ConfigError(f"column {name!r} has {column.null_count} null rows")
    if len(table) == 0:
        raise ConfigError("column 'features' has no rows")
    lengths = pc.list_value_length(features).to_numpy()
    width = int(lengths[0])
    if (lengths != width).any():
        row = int(np.argmax(lengths != width))
        raise ConfigError(
            f"column 'features' is ragged: row 0 has {width} values, row {row} has {lengths[row]}"
        )
    flat = pc.list_flatten(features)
    if width == 0 or flat.null_count:
        raise ConfigError("column 'features' has empty lists or nulls inside lists")
    x = _values(flat).reshape(len(table), width)
    y = _values(label)
    return x, (y.reshape(len(table), -1) if listed else y)


def _values(column: Any) -> np.ndarray:
    """A column's values; a view of Arrow's buffer when one chunk holds them, else one copy."""
    chunks = column.chunks if hasattr(column, "chunks") else [column]
    arrays = [c.to_numpy(zero_copy_only=False) for c in chunks]
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


# How Spark writes a pyspark.ml.linalg vector column (VectorUDT) to Parquet
SPARK_VECTOR_FIELDS = {"type", "size", "indices", "values"}


def _hint(ftype: Any) -> str:
    """What to do about a features column Spark wrote as ML vectors; nothing for another type."""
    import pyarrow as pa

    if not pa.types.is_struct(ftype) or {f.name for f in ftype} != SPARK_VECTOR_FIELDS:
        return ""
    return (
        "; it holds Spark ML vectors (a VectorAssembler's output): write it as an array,"
        " df.withColumn('features', pyspark.ml.functions.vector_to_array('features')),"
        " or pass the DataFrame to ember.spark.fit, which takes vectors"
    )


def _hold_out(
    where: str, x: np.ndarray, y: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Split off the last max(1, n // 10) rows as the test set (views, no copy)."""
    n = len(x)
    if n < 2:
        raise ConfigError(f"{where}: only {n} row; need at least 2 to hold out a test set")
    cut = n - max(1, n // 10)
    return x[:cut], y[:cut], x[cut:], y[cut:]


def _make(
    name: str,
    where: str,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    held_out: bool = False,
) -> Dataset:
    if x_train.shape[1:] != x_test.shape[1:]:
        raise ConfigError(
            f"{where}: training rows have shape {x_train.shape[1:]} but test rows have shape"
            f" {x_test.shape[1:]}"
        )
    num_classes = output_width(y_train, y_test)
    input_shape = tuple(int(d) for d in x_train.shape[1:])
    return Dataset(name, x_train, y_train, x_test, y_test, num_classes, input_shape, held_out)


def _validated(
    where: str,
    x: np.ndarray,
    y: np.ndarray,
    x_what: str,
    y_what: str,
    targets: str | None = "classes",
    ids: bool = False,
    views: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Check one input/target pair and convert it: inputs to C-contiguous float32 (int64 kept
    as token ids when `ids`; a structured array kept), targets as the loss's `targets` kind
    takes them (config/objective.py): int64 classes, float32 values, or as they are (None). A
    read-only view of Arrow memory is copied unless `views` (rows the caller copies itself)."""
    if x.dtype.kind not in "biuf" and x.dtype.names is None:
        raise ConfigError(f"{where}: {x_what} must be numeric, got dtype {x.dtype}")
    if x.ndim < 2 and x.dtype.names is None:
        raise ConfigError(f"{where}: {x_what} must have shape (rows, features...), got {x.shape}")
    if y.dtype.kind not in "biuf":
        wanted = "integer labels" if targets == "classes" else "numbers"
        raise ConfigError(f"{where}: {y_what} must hold {wanted}, got dtype {y.dtype}")
    if y.ndim < 1 or (targets == "classes" and y.ndim != 1 and y.dtype.kind == "f"):
        raise ConfigError(f"{where}: {y_what} must be 1-D (one label per row), got shape {y.shape}")
    if len(x) != len(y):
        raise ConfigError(f"{where}: {x_what} has {len(x)} rows but {y_what} has {len(y)}")
    if len(x) == 0:
        raise ConfigError(f"{where}: {x_what} has no rows")
    x = _inputs(where, x, x_what, ids, views)
    if targets in ("values", "binary") or (targets is None and y.dtype.kind == "f"):
        y = np.ascontiguousarray(y, dtype=np.float32)
        finite = np.isfinite(y).reshape(len(y), -1).all(axis=1)
        if not finite.all():
            raise ConfigError(f"{where}: {y_what} has NaN or Inf in row {int(np.argmin(finite))}")
        return x, y
    bad = (y < 0) & (y != IGNORED_CLASS) if y.ndim > 1 else y < 0
    if y.dtype.kind == "f":
        bad |= ~np.isfinite(y) | (y != np.floor(y))
    if bad.any():
        row = int(np.argmax(bad.reshape(len(y), -1).any(axis=1)))
        raise ConfigError(
            f"{where}: {y_what} has label {y[row]} in row {row}; labels must be integers >= 0"
        )
    return x, np.ascontiguousarray(y, dtype=np.int64)


def _inputs(where: str, x: np.ndarray, x_what: str, ids: bool, views: bool = False) -> np.ndarray:
    """Inputs as a Dataset holds them; float inputs checked finite, by row."""
    if x.dtype.names is not None or (ids and x.dtype.kind in "iu" and x.dtype.itemsize >= 4):
        x = np.ascontiguousarray(x if x.dtype.names is not None else x.astype(np.int64))
        return x if x.flags.writeable else x.copy()
    with np.errstate(over="ignore"):  # overflow to Inf is reported just below, by row
        x = np.ascontiguousarray(x, dtype=np.float32)
    if not x.flags.writeable and not views:
        x = x.copy()  # a zero-copy view of Arrow memory; a Dataset's arrays are the caller's
    # after the cast, so float64 values beyond float32's range are caught too
    finite = np.isfinite(x).reshape(len(x), -1).all(axis=1)
    if not finite.all():
        row = int(np.argmin(finite))
        raise ConfigError(f"{where}: {x_what} has NaN or Inf in row {row}")
    return x
