"""Spark DataFrames as training data: column checks on the driver, frames made of arrays.

Imports pyspark only inside functions; the tasks' half (Arrow partitions as NumPy) is arrow.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from ember.data.arrow import FEATURES, LABEL, WEIGHT, table_arrays, values_like
from ember.data.dataset import Dataset
from ember.data.idx import normalize_images
from ember.errors import ConfigError

_INF = float("inf")


@dataclass(frozen=True)
class FrameFacts:
    """What the driver learns about a training frame in one pass, before any worker starts."""

    rows: int  # rows over all partitions
    partition_rows: tuple[int, ...]  # rows per partition, in partition order
    width: int  # values in every features array
    max_label: int  # the largest label
    label_width: int = 0  # values in every label array; 0: one number per row

    @classmethod
    def local(cls, rows: int, partitions: int, width: int, max_label: int) -> FrameFacts:
        """The facts of a frame frame_from_arrays or frame_from_pixels made of checked local
        rows: Spark keeps one partition per Arrow batch of ceil(rows / partitions) rows."""
        batch = max(1, -(-rows // partitions))  # no rows: no partitions
        sizes = tuple(min(batch, rows - start) for start in range(0, rows, batch))
        return cls(rows, sizes, width, max_label)

    def rows_per_worker(self, workers: int, batch_size: int) -> tuple[int, bool]:
        """(rows each worker trains on, whether to repartition first). Partitions are kept when
        there is one per worker and the smallest holds at least 90% of an even share: each
        worker then trains on the smallest partition's row count."""
        parts, even = self.partition_rows, self.rows // workers
        keep = len(parts) == workers and min(parts) >= 0.9 * even
        rows = min(parts) if keep else even
        if rows < batch_size:
            raise ConfigError(
                f"each of {workers} workers would train on {rows} rows, fewer than one batch"
                f" of {batch_size}; lower batch_size or workers"
            )
        return rows, not keep


def training_frame(
    df: Any,
    features_col: str,
    label_col: str,
    targets: str = "classes",
    weight_col: str | None = None,
) -> tuple[Any, FrameFacts]:
    """Select `features` (array<float>) and `label` from `df` and check every row in one Spark
    job; raise ConfigError naming the column for anything a worker could not train on. The
    label is bigint class indices >= 0 when `targets` is "classes", else finite floats, or
    arrays of them of one width (a multi-output regression's targets). A `weight_col` of
    numbers >= 0 (not all 0) comes along as `weight`, float, checked in a job of its own."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    features = features_array(df, features_col)
    arrays = isinstance(_label_type(df, label_col), T.ArrayType)
    if arrays and targets == "classes":
        raise ConfigError(
            f"column {label_col!r} holds arrays, which a loss whose targets are values (mse, l1,"
            " huber, bce_with_logits) trains on; cross_entropy takes one class per row"
        )
    label = F.col(label_col).cast("array<double>" if arrays else "double")
    checked = df.select(features.alias(FEATURES), label.alias(LABEL))
    facts = _facts(checked, features_col, label_col, targets, arrays)
    kind = "bigint" if targets == "classes" else "array<float>" if arrays else "float"
    columns = [F.col(FEATURES), F.col(LABEL).cast(kind).alias(LABEL)]
    if weight_col is None:
        return checked.select(*columns), facts
    weight = _checked_weights(df, weight_col)
    return df.select(features.alias(FEATURES), label.alias(LABEL), weight).select(
        *columns, WEIGHT
    ), facts


def _checked_weights(df: Any, weight_col: str) -> Any:
    """Column `weight_col` as float `weight`, once every row holds a finite number >= 0 and
    some a positive one: else one ConfigError naming the column."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    found = {f.name: f.dataType for f in df.schema.fields}.get(weight_col)
    if not isinstance(found, T.NumericType):
        got = found.simpleString() if found else "no such column"
        raise ConfigError(f"weight column {weight_col!r} must hold numbers, got {got}")
    w = F.col(weight_col).cast("double")
    bad = w.isNull() | F.isnan(w) | (F.abs(w) == _INF) | (w < 0)
    counts = df.select(F.sum(bad.cast("long")), F.sum(F.when(~bad, w))).first() or (0, 0)
    if counts[0]:
        raise ConfigError(f"weight column {weight_col!r} has {counts[0]} null, NaN, Inf or < 0")
    if not counts[1]:
        raise ConfigError(f"weight column {weight_col!r} sums to 0: no row would train")
    return w.cast("float").alias(WEIGHT)


def label_targets(df: Any, label_col: str, targets: str | None) -> str:
    """The kind of targets `df`'s label column holds for the loss's `targets` kind
    (objective.targets_of): a user's loss (None) takes integer columns as classes and
    fractional ones as values."""
    from pyspark.sql import types as T

    if targets is not None:
        return targets
    integral = isinstance(_label_type(df, label_col), (T.IntegralType, T.BooleanType))
    return "classes" if integral else "values"


def _label_type(df: Any, label_col: str) -> Any:
    from pyspark.sql import types as T

    fields = {f.name: f.dataType for f in df.schema.fields}
    if label_col not in fields:
        raise ConfigError(
            f"DataFrame has no label column {label_col!r} (columns: {', '.join(fields)})"
        )
    ltype = fields[label_col]
    numbers = isinstance(ltype, T.ArrayType) and isinstance(ltype.elementType, T.NumericType)
    if not (numbers or isinstance(ltype, (T.NumericType, T.BooleanType))):
        raise ConfigError(
            f"column {label_col!r} must hold numeric labels or arrays of numbers, got"
            f" {ltype.simpleString()}"
        )
    return ltype


def features_array(df: Any, features_col: str) -> Any:
    """Column `features_col` of `df` as array<float>, from a Spark ML vector (dense or sparse,
    e.g. a VectorAssembler's output) or a numeric array; ConfigError naming it otherwise."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    fields = {f.name: f.dataType for f in df.schema.fields}
    if features_col not in fields:
        raise ConfigError(
            f"DataFrame has no features column {features_col!r} (columns: {', '.join(fields)})"
        )
    ftype = fields[features_col]
    if isinstance(ftype, VectorUDT):
        return vector_to_array(F.col(features_col), "float32")
    if isinstance(ftype, T.ArrayType) and isinstance(ftype.elementType, T.NumericType):
        return F.col(features_col).cast("array<float>")  # half the bytes of double on the wire
    raise ConfigError(
        f"column {features_col!r} must be array<float>, array<double> or a Spark ML vector,"
        f" got {ftype.simpleString()}"
    )


# per-partition counts computed in the tasks; every field is a long but the labels' extremes
_FACT_FIELDS = (
    "partition",
    "rows",
    "null_features",
    "bad_values",
    "min_width",
    "max_width",
    "null_labels",
    "bad_labels",
    "min_label",
    "max_label",
)
_FLOATS = ("min_label", "max_label")
_FACTS_DDL = ", ".join(f"{n} {'double' if n in _FLOATS else 'long'}" for n in _FACT_FIELDS)


# what a partition's bad_labels counts, by the kind of targets
_BAD_LABELS = {
    "classes": "labels that are not integers >= 0",
    "values": "labels that are NaN or Inf",
    "binary": "labels that are NaN or Inf",
    "arrays": "rows with a null, NaN or Inf value",
}


def _facts(
    frame: Any, features_col: str, label_col: str, targets: str, arrays: bool = False
) -> FrameFacts:
    from pyspark.sql import functions as F

    f, bad = F.col(FEATURES), lambda v: v.isNull() | F.isnan(v) | (F.abs(v) == _INF)
    label = F.col(LABEL)
    if arrays:  # a row's label stands for its width here, NaN when a value is not finite
        width = F.when(F.exists(label, bad), F.lit(float("nan"))).otherwise(F.size(label))
        label = F.when(label.isNotNull(), width.cast("double"))
    per_row = frame.select(
        f.isNull().alias("null"),
        F.size(f).alias("width"),
        F.coalesce(F.exists(f, bad), F.lit(False)).alias("bad"),
        label.alias(LABEL),
    )
    # Counted in the tasks, not by a groupBy on spark_partition_id(): the optimizer may fold
    # that into a driver-side scan of a local relation, and then every row is in partition 0.
    counts = partial(_partition_facts, targets == "classes")
    found = [r.asDict() for r in per_row.mapInArrow(counts, _FACTS_DDL).collect()]
    total = lambda key: sum(int(r[key] or 0) for r in found)  # noqa: E731
    rows = total("rows")
    if rows == 0:
        raise ConfigError(f"column {features_col!r} has no rows")
    for key, column, what in (
        ("null_features", features_col, "null rows"),
        ("bad_values", features_col, "rows with a null, NaN or Inf value"),
        ("null_labels", label_col, "null rows"),
        ("bad_labels", label_col, _BAD_LABELS["arrays" if arrays else targets]),
    ):
        if total(key):
            raise ConfigError(f"column {column!r} has {total(key)} {what}")
    found = [r for r in found if r["rows"]]
    low, high = min(r["min_width"] for r in found), max(r["max_width"] for r in found)
    if low != high:
        raise ConfigError(
            f"column {features_col!r} is ragged: its arrays hold between {low} and {high} values"
        )
    if high == 0:
        raise ConfigError(f"column {features_col!r} holds empty arrays")
    largest = max(r["max_label"] for r in found)
    if arrays and min(r["min_label"] for r in found) != largest:
        low = min(r["min_label"] for r in found)
        raise ConfigError(
            f"column {label_col!r} is ragged: its arrays hold between {low:g} and {largest:g}"
            " values"
        )
    if arrays and largest == 0:
        raise ConfigError(f"column {label_col!r} holds empty arrays")
    sizes = {int(r["partition"]): int(r["rows"]) for r in found}
    return FrameFacts(
        rows=rows,
        partition_rows=_partition_rows(frame, sizes),
        width=int(high),
        max_label=int(largest),
        label_width=int(largest) if arrays else 0,
    )


def _partition_rows(frame: Any, sizes: dict[int, int]) -> tuple[int, ...]:
    """Rows per partition, in partition order; none under Spark Connect, whose frames have no
    RDD to count the partitions of (empty ones report no rows): the run repartitions them."""
    if type(frame).__module__.startswith("pyspark.sql.connect"):
        return ()
    return tuple(sizes.get(p, 0) for p in range(frame.rdd.getNumPartitions()))


def _partition_facts(classes: bool, batches: Iterable[Any]) -> Iterable[Any]:
    """In a task: one row of counts over this partition's per-row checks; a label is bad when
    not finite, or, as `classes`, not an integer >= 0."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark import TaskContext

    context = TaskContext.get()
    assert context is not None  # always set inside a Spark task
    facts: dict[str, Any] = {"partition": context.partitionId(), "rows": 0}
    batches = [b for b in batches if b.num_rows]
    if batches:
        table = pa.Table.from_batches(batches)
        widths = pc.min_max(pc.filter(table.column("width"), pc.invert(table.column("null"))))
        label = table.column(LABEL)
        y = pc.drop_null(label).to_numpy()
        finite = y[np.isfinite(y)]
        facts |= {
            "rows": table.num_rows,
            "null_features": pc.sum(table.column("null")).as_py(),
            "bad_values": pc.sum(table.column("bad")).as_py(),
            "min_width": widths["min"].as_py(),
            "max_width": widths["max"].as_py(),
            "null_labels": label.null_count,
            "bad_labels": len(y) - int(np.sum(_good(finite) if classes else finite.size)),
            "min_label": float(finite.min()) if finite.size else 0.0,
            "max_label": float(finite.max()) if finite.size else 0.0,
        }
    types = {n: pa.float64() if n in _FLOATS else pa.int64() for n in _FACT_FIELDS}
    yield pa.RecordBatch.from_pylist([facts], schema=pa.schema(list(types.items())))


def _good(labels: np.ndarray) -> np.ndarray:
    return (np.rint(labels) == labels) & (labels >= 0)


def dataframe_dataset(
    df: Any,
    features_col: str,
    label_col: str,
    test_df: Any,
    seed: int,
    targets: str | None = "classes",
    weight_col: str | None = None,
) -> tuple[Any, FrameFacts, Dataset]:
    """The checked training frame, its facts, and a driver-side Dataset holding the test set:
    `test_df`, or a seeded tenth of `df` held out. Only the test rows reach the driver. The
    labels are the loss's `targets` kind (objective.targets_of): int64 classes, or float32
    values for "values" and "binary" (a one-wide output, or one output per value of a label
    column of arrays). The training frame carries `weight_col` as `weight`; the test rows are
    scored unweighted."""
    kind = label_targets(df, label_col, targets)
    if test_df is None:
        df, test_df = df.randomSplit([0.9, 0.1], seed=seed)
    frame, facts = training_frame(df, features_col, label_col, kind, weight_col)
    test, test_facts = training_frame(test_df, features_col, label_col, kind)
    if test_facts.width != facts.width:
        raise ConfigError(
            f"column {features_col!r} holds {facts.width} values per row in df but"
            f" {test_facts.width} in test_df"
        )
    name, shape = f"spark:{features_col}", (facts.width,)
    if kind == "classes":
        x_test, y_test = table_arrays(test.toArrow(), shape)
        outputs = max(2, facts.max_label + 1, test_facts.max_label + 1)
    else:  # what table_arrays takes the targets' kind and shape from: a Dataset like them
        if test_facts.label_width != facts.label_width:
            raise ConfigError(
                f"column {label_col!r} holds {facts.label_width or 'one'} value(s) per row in df"
                f" but {test_facts.label_width or 'one'} in test_df"
            )
        outputs = max(1, facts.label_width)
        x_test, y_test = table_arrays(test.toArrow(), shape, values_like(shape, facts.label_width))
    # The training rows stay in Spark; the test rows stand in for them so the Dataset is whole.
    return frame, facts, Dataset(name, x_test, y_test, x_test, y_test, outputs, shape)


def frame_from_arrays(spark: Any, x: np.ndarray, y: np.ndarray, partitions: int) -> Any:
    """A DataFrame of `features` (array<float>, or array<bigint> of token ids) and `label`
    (bigint classes, or an array of a row's targets) rows, handed to Spark as Arrow record
    batches (no Python objects per row), in about `partitions` even partitions."""
    if x.dtype.names is not None:
        raise ConfigError(
            "data with several named inputs (a dict of arrays) trains on the local engine;"
            " on Spark pass one array of inputs"
        )
    dtype = np.int64 if x.dtype == np.int64 else np.float32
    return _arrow_frame(spark, _row_lists(x.astype(dtype, copy=False)), y, partitions)


def _row_lists(values: np.ndarray) -> Any:
    """Each row of `values` as one fixed-size list, its values flat, no copy."""
    import pyarrow as pa

    flat = np.ascontiguousarray(values).reshape(len(values), -1)
    return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), flat.shape[1])


def frame_from_pixels(spark: Any, pixels: np.ndarray, y: np.ndarray, partitions: int) -> Any:
    """As frame_from_arrays for IDX images, whose `features` are each image's uint8 bytes
    (binary): a quarter of the floats' size, and one value per row rather than one per pixel
    for the JVM to convert. Tasks normalize them as the loader does (partition_arrays)."""
    if pixels.size >= 2**31:  # binary offsets are int32
        return frame_from_arrays(spark, normalize_images(pixels), y, partitions)
    return _arrow_frame(spark, pixel_column(pixels), y, partitions)


def pixel_column(pixels: np.ndarray) -> Any:
    """uint8 images (n, rows, cols) as an Arrow binary array of one value per image, no copy."""
    import pyarrow as pa

    flat = np.ascontiguousarray(pixels, dtype=np.uint8).reshape(-1)
    width = max(1, flat.size // max(1, len(pixels)))
    offsets = np.arange(0, flat.size + 1, width, dtype=np.int32)
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(flat)]
    return pa.Array.from_buffers(pa.binary(), len(pixels), buffers)


def _arrow_frame(spark: Any, features: Any, y: np.ndarray, partitions: int) -> Any:
    import pyarrow as pa

    label = pa.array(y) if y.ndim == 1 else _row_lists(y)
    table = pa.table({FEATURES: features, LABEL: label})
    # Set for this call alone. With no local-relation threshold Spark keeps the Arrow batches
    # as they are, one partition each, and the tasks read them; below its threshold (48 MB,
    # which MNIST's images just fit) the driver would convert every row first and the tasks
    # convert them back, a second or more of one JVM thread.
    batch_rows = -(-len(y) // partitions)
    settings = {
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(batch_rows),
        "spark.sql.execution.arrow.localRelationThreshold": "0",
    }
    saved = {key: spark.conf.get(key) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        return spark.createDataFrame(table)
    finally:
        for key, value in saved.items():
            spark.conf.set(key, value)
