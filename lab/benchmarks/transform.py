"""transform: EmberModel.transform against Spark's predict_batch_udf, the same model and batch.

One SparkSession (local[2]) scores the same Parquet rows (a `features` array<float> column)
with the same mlp, the same number of rows per batch and the same outputs (the class index and
the class probabilities), written to Spark's `noop` sink so that every row is scored and none
reaches the driver:
- **ember**: `EmberModel.transform`.
- **predict_batch_udf**: `pyspark.ml.functions.predict_batch_udf`, whose `make_predict_fn`
  builds the module from the same model.safetensors.

Both run back to back in alternating order per repeat, after one untimed pass of each (every
Python worker started, torch imported). Reported: rows/s of each and their ratio (median and
range over repeats), and the driver's memory while scoring: the peak resident memory of this
Python process and of the driver's JVM, sampled every 50 ms. On a local master that JVM runs
the tasks too, so its figure includes theirs; the driver's Python process is the driver alone.

Rows are 64 features by default (--width): 1,000,000 rows of MNIST's 784 would be 3 GB of
Parquet. --quick scores 20,000 rows once; the default is 1,000,000 rows, 5 repeats.

Usage: python lab/benchmarks/transform.py [--rows N] [--width W] [--batch B] [--repeat R] [--quick]
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from common import fmt, make_parser, markdown_table, positive_int, report, spread
from ember.config import RunConfig
from ember.probe import MODEL_FILE, build_model, save_model


def model_folder(root: Path, width: int) -> Path:
    """An mlp for `width` inputs and 10 classes, as a run leaves it (its weights do not matter
    for throughput)."""
    folder = root / "model"
    config = RunConfig(model="mlp")
    save_model(folder, build_model("mlp", (width,), 10), config, ((width,), 10))
    return folder


def write_rows(spark: Any, path: Path, rows: int, width: int) -> None:
    from pyspark.sql import functions as F

    values = [F.rand(seed=i).cast("float") for i in range(width)]
    frame = spark.range(rows, numPartitions=4).select(F.array(*values).alias("features"))
    frame.write.mode("overwrite").parquet(str(path))


def with_ember(folder: Path) -> Callable[[Any], Any]:
    from ember.spark_ml import EmberModel

    model = EmberModel.from_files(folder, "mlp")
    return model.transform


def with_predict_batch_udf(folder: Path, width: int, batch: int) -> Callable[[Any], Any]:
    import numpy as np
    from pyspark.ml.functions import array_to_vector, predict_batch_udf
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, DoubleType, StructField, StructType

    weights = (folder / MODEL_FILE).read_bytes()

    def make_predict_fn() -> Callable[[np.ndarray], dict[str, np.ndarray]]:
        import safetensors.torch
        import torch

        from ember.probe import build_model

        module = build_model("mlp", (width,), 10)
        module.load_state_dict(safetensors.torch.load(weights), strict=True)
        module.eval()

        def predict(x: np.ndarray) -> dict[str, np.ndarray]:
            with torch.no_grad():
                logits = module(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)))
            probabilities = torch.softmax(logits.double(), dim=1).numpy()
            return {
                "prediction": probabilities.argmax(axis=1).astype(np.float64),
                "probability": probabilities,
            }

        return predict

    result = StructType(
        [
            StructField("prediction", DoubleType()),
            StructField("probability", ArrayType(DoubleType())),
        ]
    )
    udf = predict_batch_udf(
        make_predict_fn, return_type=result, batch_size=batch, input_tensor_shapes=[[width]]
    )

    def transform(frame: Any) -> Any:
        scored = frame.withColumn("scores", udf("features"))
        return scored.select(
            "*",
            F.col("scores.prediction").alias("prediction"),
            array_to_vector("scores.probability").alias("probability"),
        ).drop("scores")

    return transform


class PeakMemory:
    """The peak resident memory of this process and of its child JVM while in the block."""

    def __init__(self) -> None:
        self.python = self.jvm = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        me = psutil.Process(os.getpid())
        jvms = [c for c in me.children() if "java" in c.name()]
        while not self._stop.wait(0.05):
            self.python = max(self.python, me.memory_info().rss)
            for jvm in jvms:
                self.jvm = max(self.jvm, jvm.memory_info().rss)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def score(frame: Any, transform: Callable[[Any], Any]) -> dict[str, float]:
    with PeakMemory() as peak:
        started = time.perf_counter()
        transform(frame).write.format("noop").mode("overwrite").save()
        seconds = time.perf_counter() - started
    mib = 1 << 20
    return {"seconds": seconds, "python_mib": peak.python / mib, "jvm_mib": peak.jvm / mib}


def main() -> None:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--rows", type=positive_int, default=1_000_000)
    parser.add_argument("--width", type=positive_int, default=64, help="features per row")
    parser.add_argument("--batch", type=positive_int, default=4096, help="rows per batch")
    args = parser.parse_args()
    rows, repeat = (20_000, 1) if args.quick else (args.rows, args.repeat)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.log.level", "WARN")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(args.batch))
        .getOrCreate()
    )
    results: dict[str, list[dict[str, float]]] = {"ember": [], "predict_batch_udf": []}
    with tempfile.TemporaryDirectory(prefix="ember-transform-") as tmp:
        folder = model_folder(Path(tmp), args.width)
        write_rows(spark, Path(tmp) / "rows", rows, args.width)
        frame = spark.read.parquet(str(Path(tmp) / "rows"))
        ways = {
            "ember": with_ember(folder),
            "predict_batch_udf": with_predict_batch_udf(folder, args.width, args.batch),
        }
        for transform in ways.values():  # every Python worker started, torch imported
            score(frame, transform)
        for index in range(repeat):
            order = list(ways) if index % 2 == 0 else list(reversed(ways))
            for name in order:
                results[name].append(score(frame, ways[name]))
    spark.stop()
    rate = {name: spread([rows / r["seconds"] for r in runs]) for name, runs in results.items()}
    ratio = spread(
        [
            b["seconds"] / a["seconds"]
            for a, b in zip(results["ember"], results["predict_batch_udf"], strict=True)
        ]
    )
    table = markdown_table(
        ["way", "rows/s", "driver Python peak MiB", "driver JVM peak MiB"],
        [
            [
                name,
                fmt(rate[name], 0),
                f"{max(r['python_mib'] for r in runs):.0f}",
                f"{max(r['jvm_mib'] for r in runs):.0f}",
            ]
            for name, runs in results.items()
        ],
    )
    table += f"\n\nember / predict_batch_udf rows/s: {fmt(ratio)} (higher is better for ember)"
    settings = {"rows": rows, "width": args.width, "batch": args.batch, "repeat": repeat}
    report("transform", table, settings, {"runs": results, "ratio": ratio}, args.out)


if __name__ == "__main__":
    main()
