"""The Spark MLlib rows of `ember bench`: LogisticRegression and MultilayerPerceptronClassifier
fit on the arrays ember trains on, timed and scored like ember's rows.

Imports pyspark and pyarrow only inside functions, so `ember bench` without MLlib rows needs
neither.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from ember.probe import Dataset

TASKS = ("lr", "mlp", "lenet")
_METRICS = {"test_accuracy": "accuracy", "test_loss": "logLoss"}  # record field -> MLlib name
_HIDDEN = [256, 256]
_ROW_GROUP_BYTES = 32 << 20


@contextmanager
def bench_session(workers: int, needed: bool, master: str | None = None) -> Iterator[Any]:
    """One SparkSession for the MLlib and Spark-engine rows (None when no row needs it), ended
    with its JVM: local[workers], or on `master` with `workers` executors of one core."""
    if not needed:
        yield None
        return
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # before the JVM starts
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from ember.probe import end_spark

    builder = (
        SparkSession.builder.master(master or f"local[{workers}]")
        .appName("ember-bench")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "4g")
    )
    if master:  # one executor of one core per worker host, as ember's rows get
        builder = builder.config("spark.executor.cores", "1").config("spark.cores.max", workers)
        builder = builder.config("spark.executor.memory", "1g")
        # gloo (TorchDistributor) binds the host's own interface, not the loopback
        builder = builder.config("spark.executorEnv.GLOO_SOCKET_IFNAME", "eth0")
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        end_spark(session)


def jvm_pids(spark: Any) -> set[int]:
    """The JVM's process id: its idle threads and memory are not an ember row's."""
    if spark is None:
        return set()
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    return {gateway.proc.pid} if gateway is not None else set()


def mllib_frames(spark: SparkSession, dataset: Dataset) -> tuple[DataFrame, DataFrame]:
    """Train and test DataFrames of `features` (dense Spark ML vectors of the flattened rows) and
    `label` (double), cached, materialized and spread over at least every task slot.

    The arrays travel through Parquet files in a temporary folder, which is deleted before this
    returns: the frames live on in Spark's cache (memory, spilling to disk), so they must not be
    unpersisted and then used again. Unpersist both when done.
    """
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql.functions import col

    # Parquet beats spark.createDataFrame on an Arrow table or Arrow-enabled pandas frame here:
    # about 9 s against 11-15 s for 60,000 x 784, 15 s against 18 s for 1,000,000 x 100.
    slots = spark.sparkContext.defaultParallelism
    folder = Path(tempfile.mkdtemp(prefix="ember-mllib-"))
    frames: list[DataFrame] = []
    try:
        for split in ("train", "test"):
            path = folder / f"{split}.parquet"
            x, y = getattr(dataset, f"x_{split}"), getattr(dataset, f"y_{split}")
            _write_parquet(path, x, y, slots)
            raw = spark.read.parquet(str(path))
            if raw.rdd.getNumPartitions() < slots:  # small files are read by a single task
                raw = raw.repartition(slots)
            frame = raw.select(array_to_vector(col("features")).alias("features"), "label").cache()
            frames.append(frame)
            frame.count()
    except BaseException:
        for frame in frames:
            frame.unpersist()
        raise
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return frames[0], frames[1]


def _write_parquet(path: Path, x: np.ndarray, y: np.ndarray, slots: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    flat = x.reshape(len(x), -1)
    features = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), flat.shape[1])
    table = pa.table({"features": features, "label": pa.array(y.astype(np.float64))})
    # Spark hands each row group to one task whole: with several groups per slot a read keeps
    # every slot busy, and 32 MB groups bound the reader's buffers on a small driver heap.
    groups = max(2 * slots, math.ceil(flat.nbytes / _ROW_GROUP_BYTES))
    # a temporary file read once: compressing it would only cost time
    pq.write_table(table, path, row_group_size=math.ceil(len(x) / groups), compression="none")


def run_mllib(
    spark: SparkSession,
    task: str,
    dataset: Dataset,
    max_iter: int,
    target_metric: str,
    target_value: float,
    seed: int = 0,
    segments: int = 1,
) -> dict[str, Any]:
    """Fit MLlib's model for `task` on `dataset` with at most `max_iter` L-BFGS iterations and
    return the figures of a bench row (see ember_lab.bench), as plain JSON values.

    lr: binomial LogisticRegression with regParam 0 (labels must be 0/1). mlp and lenet:
    MultilayerPerceptronClassifier with layers [features, 256, 256, classes]; MLlib has no
    convolutions, so this MLP stands in for LeNet too. With `segments` > 1 the MLP is fit in
    that many consecutive fits, each starting from the previous weights, splitting max_iter
    between them, with the target metric evaluated on the test set after each; every fit
    restarts L-BFGS's curvature history, so more segments can mean slower convergence.
    LogisticRegression cannot start from given weights in pyspark, so lr ignores `segments` and
    fits once; for target_metric test_loss its curve is then the training objective after each
    iteration (the mean training log loss, as regParam is 0), with the fit's time spread evenly
    over the iterations, followed by the final test loss, so time_to_target compares training
    losses with the target until the last point. For test_accuracy the curve is the final point
    alone. Only the fit calls are timed.
    """
    if task not in TASKS:
        raise ValueError(f"unknown MLlib bench task {task!r}; expected one of {', '.join(TASKS)}")
    if target_metric not in _METRICS:
        raise ValueError(
            f"unknown target metric {target_metric!r}; expected one of {', '.join(_METRICS)}"
        )
    if max_iter < 1 or not 1 <= segments <= max_iter:
        raise ValueError(
            f"need max_iter >= 1 and 1 <= segments <= max_iter, got {max_iter} and {segments}"
        )
    if task == "lr" and dataset.num_classes != 2:
        raise ValueError(
            f"task 'lr' needs binary labels, but dataset {dataset.name} has"
            f" {dataset.num_classes} classes"
        )
    started = time.perf_counter()
    train, test = mllib_frames(spark, dataset)
    prepare_seconds = time.perf_counter() - started
    rows = len(dataset.x_train)
    try:
        if task == "lr":
            row = _fit_lr(train, test, rows, max_iter, target_metric)
        else:
            layers = [int(np.prod(dataset.input_shape)), *_HIDDEN, dataset.num_classes]
            row = _fit_mlp(train, test, rows, max_iter, target_metric, layers, seed, segments)
    finally:
        train.unpersist()
        test.unpersist()
    seconds, iterations, curve = row["train_seconds"], row["iterations"], row["curve"]
    time_to_target, samples_to_target = _first_reaching(curve, target_metric, target_value)
    row.update(
        samples=iterations * rows,
        samples_per_second=iterations * rows / seconds if seconds > 0 else None,
        # one L-BFGS iteration is about one pass over the data; line searches can add passes
        seconds_per_epoch=seconds / iterations if iterations else None,
        time_to_target=time_to_target,
        samples_to_target=samples_to_target,
        prepare_seconds=prepare_seconds,
    )
    row["config"].update(task=task, train_rows=rows, test_rows=len(dataset.x_test))
    return row


def _fit_lr(
    train: DataFrame, test: DataFrame, rows: int, max_iter: int, target_metric: str
) -> dict[str, Any]:
    from pyspark.ml.classification import LogisticRegression

    estimator = LogisticRegression(maxIter=max_iter, regParam=0.0, family="binomial")
    started = time.perf_counter()
    model = estimator.fit(train)
    seconds = time.perf_counter() - started
    history = [float(v) for v in model.summary.objectiveHistory]
    iterations = int(model.summary.totalIterations)
    scores = _evaluate(model, test, list(_METRICS))
    curve: list[list[float]] = []
    if target_metric == "test_loss":
        # history[0] is the objective at the starting point, history[i] the one after iteration i
        for i in range(1, min(iterations, len(history) - 1) + 1):
            curve.append([seconds * i / iterations, i * rows, history[i]])
    curve.append([seconds, iterations * rows, scores[target_metric]])
    names = ("maxIter", "regParam", "family", "tol", "standardization", "fitIntercept")
    return _row(scores, seconds, iterations, curve, "LogisticRegression", estimator, names)


def _fit_mlp(
    train: DataFrame,
    test: DataFrame,
    rows: int,
    max_iter: int,
    target_metric: str,
    layers: list[int],
    seed: int,
    segments: int,
) -> dict[str, Any]:
    from pyspark.ml.classification import MultilayerPerceptronClassifier

    seconds, iterations, weights = 0.0, 0, None
    curve: list[list[float]] = []
    scores: dict[str, float] = {}
    for segment in range(segments):
        budget = max_iter // segments + (segment < max_iter % segments)
        estimator = MultilayerPerceptronClassifier(
            layers=layers, maxIter=budget, seed=seed, solver="l-bfgs"
        )
        if weights is not None:
            estimator.setInitialWeights(weights)
        started = time.perf_counter()
        model = estimator.fit(train)
        seconds += time.perf_counter() - started
        weights = model.weights
        iterations += _iterations_run(model, budget)
        last = segment == segments - 1
        scores = _evaluate(model, test, list(_METRICS) if last else [target_metric])
        curve.append([seconds, iterations * rows, scores[target_metric]])
    names = ("layers", "solver", "seed", "tol", "blockSize")
    row = _row(
        scores, seconds, iterations, curve, "MultilayerPerceptronClassifier", estimator, names
    )
    row["config"].update(maxIter=max_iter, segments=segments)
    return row


def _iterations_run(model: Any, budget: int) -> int:
    """L-BFGS's iterations in one fit: fewer than maxIter when it converged early."""
    if not model.hasSummary:
        return budget
    summary = model.summary
    # pyspark's MLP model defines summary as a method, every other model as a property
    return int((summary() if callable(summary) else summary).totalIterations)


def _evaluate(model: Any, test: DataFrame, metrics: list[str]) -> dict[str, float]:
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator

    predictions = model.transform(test)
    evaluator = MulticlassClassificationEvaluator()
    # as a param map: pyspark's type hints for metricName leave out logLoss, which Spark has
    return {
        m: float(evaluator.evaluate(predictions, {evaluator.metricName: _METRICS[m]}))
        for m in metrics
    }


def _row(
    scores: dict[str, float],
    seconds: float,
    iterations: int,
    curve: list[list[float]],
    name: str,
    estimator: Any,
    params: tuple[str, ...],
) -> dict[str, Any]:
    config: dict[str, Any] = {"estimator": name}
    config.update({p: estimator.getOrDefault(p) for p in params})
    return {
        "test_accuracy": scores["test_accuracy"],
        "test_loss": scores["test_loss"],
        "train_seconds": seconds,
        "iterations": iterations,
        "curve": curve,
        "config": config,
    }


def _first_reaching(
    curve: list[list[float]], target_metric: str, target_value: float
) -> tuple[float | None, int | None]:
    """(seconds, samples) at the first curve point meeting the target, or (None, None)."""
    higher_is_better = target_metric == "test_accuracy"
    for seconds, samples, value in curve:
        if value >= target_value if higher_is_better else value <= target_value:
            return seconds, int(samples)
    return None, None


__all__ = ["TASKS", "mllib_frames", "run_mllib"]
