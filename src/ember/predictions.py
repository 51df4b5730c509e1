"""`ember predict`: a run's model over a file's rows in batches, each batch's predictions
written before the next is read, so memory holds one batch whatever the file's size.

imports: data, errors, export
"""

from __future__ import annotations

import contextlib
import json
import os
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ember.data.pixels import to_model_inputs
from ember.errors import ConfigError
from ember.export import JSON_LIMIT, MODEL_JSON, ModelSource, load_with_shape

OUTPUTS = (".parquet", ".csv")


def predict(
    run: str | Path,
    data: str | Path,
    out: str | Path,
    model: ModelSource = None,
    batch_size: int = 4096,
) -> dict[str, Any]:
    """Write the class and the class probabilities the model of `run` (a run directory or a
    checkpoint, as ember.load takes) gives each row of `data` (an .npz's `x` or `x_test`, an
    .npy, a Parquet file or folder's `features`, or a named dataset's test rows) to `out`
    (.parquet or .csv, written whole or not at all). Returns what it did."""
    out = Path(out).expanduser()
    if out.suffix not in OUTPUTS:
        raise ConfigError(f"out {out}: expected a .parquet or .csv file, got {out.suffix!r}")
    if out.exists():
        raise ConfigError(f"out {out} already exists; choose another path")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    module, (input_shape, classes) = load_with_shape(run, model)
    transform = recorded_transform(Path(run).expanduser())
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    rows, done = 0, set()
    try:
        with _writer(tmp, out.suffix, classes) as write:
            for raw in read_features(str(data), batch_size):
                features, said = to_model_inputs(raw, transform)
                done |= {said} if said else set()
                probabilities = _probabilities(module, features, input_shape, str(data), rows)
                write(probabilities.argmax(axis=1), probabilities)
                rows += len(features)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    facts = {"run": str(run), "data": str(data), "out": str(out), "rows": rows}
    return {**facts, "classes": classes, "input_transform": sorted(done) or None}


def recorded_transform(run: Path) -> object:
    """The input transform a run's model.json records (None: none, or no model.json)."""
    described = run / MODEL_JSON
    if not described.is_file():
        return None
    with open(described, "rb") as f:
        raw = f.read(JSON_LIMIT + 1)
    try:
        parsed = json.loads(raw) if len(raw) <= JSON_LIMIT else {}
    except ValueError:
        return None  # load_with_shape has said what is wrong with it already
    return parsed.get("input_transform") if isinstance(parsed, dict) else None


@torch.no_grad()
def _probabilities(
    module: torch.nn.Module,
    features: np.ndarray,
    input_shape: tuple[int, ...],
    where: str,
    row: int,
) -> np.ndarray:
    width = int(np.prod(input_shape))
    if features[0].size != width:
        raise ConfigError(
            f"data {where}: rows have {features[0].size} values from row {row} on; the model"
            f" takes {width} (input shape {list(input_shape)})"
        )
    inputs = torch.from_numpy(np.require(features, np.float32, ["C", "W"]))  # a mapped file: copied
    logits = module(inputs.reshape(len(features), *input_shape))
    if logits.ndim != 2:
        raise ConfigError(
            f"the model's output has shape {list(logits.shape)}; predict writes classes and"
            " probabilities of a classifier's (rows, classes) output"
        )
    return torch.softmax(logits.float(), dim=1).numpy()


@contextlib.contextmanager
def _writer(path: Path, kind: str, classes: int) -> Iterator[Any]:
    """A function taking (classes, probabilities) of a batch and appending them to `path`,
    a `kind` (.parquet or .csv) file."""
    if kind == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = pa.schema(
            [("prediction", pa.int64()), ("probability", pa.list_(pa.float32(), classes))]
        )
        with pq.ParquetWriter(str(path), schema) as writer:

            def write_parquet(labels: np.ndarray, probabilities: np.ndarray) -> None:
                values = pa.array(probabilities.reshape(-1).astype(np.float32))
                table = pa.table(
                    {
                        "prediction": pa.array(labels.astype(np.int64)),
                        "probability": pa.FixedSizeListArray.from_arrays(values, classes),
                    },
                    schema=schema,
                )
                writer.write_table(table)

            yield write_parquet
        return
    with open(path, "w") as f:
        f.write(",".join(["prediction", *(f"p{k}" for k in range(classes))]) + "\n")

        def write_csv(labels: np.ndarray, probabilities: np.ndarray) -> None:
            table = np.column_stack([labels.astype(np.float64), probabilities])
            formats = ["%d", *(["%.6g"] * classes)]
            np.savetxt(f, table, fmt=formats, delimiter=",")

        yield write_csv


def read_features(data: str, batch_size: int) -> Iterator[np.ndarray]:
    """Batches of rows of `data`, read as they are needed."""
    path = Path(data).expanduser()
    if path.suffix == ".npy" and path.is_file():
        array = np.load(path, mmap_mode="r", allow_pickle=False)
        yield from _slices(array, batch_size, data)
    elif path.suffix == ".npz" and path.is_file():
        yield from _npz_rows(path, batch_size)
    elif path.suffix == ".parquet" or path.is_dir():
        yield from _parquet_rows(path, batch_size)
    elif path.exists():
        raise ConfigError(f"data {data}: expected .npz, .npy or Parquet, got {path.suffix!r}")
    else:
        from ember.data import load_dataset

        yield from _slices(load_dataset(data).x_test, batch_size, data)


def _slices(array: np.ndarray, batch_size: int, where: str) -> Iterator[np.ndarray]:
    if array.ndim < 2 or array.dtype.kind not in "biuf":
        raise ConfigError(
            f"data {where}: expected numeric rows (rows, features...), got {array.dtype}"
            f"{list(array.shape)}"
        )
    for start in range(0, len(array), batch_size):
        yield np.asarray(array[start : start + batch_size])


def _npz_rows(path: Path, batch_size: int) -> Iterator[np.ndarray]:
    """The rows of an .npz's `x` (else `x_test`), streamed out of the archive: np.load would
    read the whole array first."""
    from numpy.lib import format as npy

    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"data {path}: not an .npz archive ({exc})") from None
    with archive:
        names = archive.namelist()
        member = next((n for n in ("x.npy", "x_test.npy") if n in names), None)
        if member is None:
            found = ", ".join(n.removesuffix(".npy") for n in names) or "no arrays"
            raise ConfigError(f"data {path}: no array 'x' or 'x_test' to predict (found {found})")
        with archive.open(member) as f:
            try:
                version = npy.read_magic(f)
                if version == (1, 0):
                    shape, fortran, dtype = npy.read_array_header_1_0(f)
                else:
                    shape, fortran, dtype = npy.read_array_header_2_0(f)
            except ValueError as exc:
                raise ConfigError(f"data {path}: array {member}: {exc}") from None
            if fortran or dtype.hasobject or len(shape) < 2 or dtype.kind not in "biuf":
                raise ConfigError(
                    f"data {path}: array {member} must be numeric rows in C order, got"
                    f" {dtype}{list(shape)}"
                )
            row_bytes = int(np.prod(shape[1:])) * dtype.itemsize
            for start in range(0, shape[0], batch_size):
                count = min(batch_size, shape[0] - start)
                raw = f.read(count * row_bytes)
                if len(raw) != count * row_bytes:
                    raise ConfigError(f"data {path}: array {member} ends at row {start}")
                yield np.frombuffer(raw, dtype=dtype).reshape(count, *shape[1:])


def _parquet_rows(path: Path, batch_size: int) -> Iterator[np.ndarray]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    try:
        source = ds.dataset(str(path), format="parquet")
        if "features" not in source.schema.names:
            raise ConfigError(
                f"data {path}: no column 'features' (found: {', '.join(source.schema.names)})"
            )
        for batch in source.to_batches(columns=["features"], batch_size=batch_size):
            column = batch.column(0)
            if not pa.types.is_list(column.type) and not pa.types.is_fixed_size_list(column.type):
                raise ConfigError(
                    f"data {path}: column 'features' must be a list of numbers, got {column.type}"
                )
            if len(column) == 0:
                continue
            width = pc.list_value_length(column).to_numpy()
            if (width != width[0]).any() or column.null_count:
                raise ConfigError(f"data {path}: column 'features' is ragged or has nulls")
            values = pc.list_flatten(column).to_numpy(zero_copy_only=False)
            yield values.reshape(len(column), int(width[0]))
    except (pa.ArrowException, OSError) as exc:
        raise ConfigError(f"data {path}: cannot read as Parquet ({exc})") from None
