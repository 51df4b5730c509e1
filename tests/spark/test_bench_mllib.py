"""ember bench's MLlib rows: the frames MLlib trains on, and the figures of an lr and mlp row."""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
from typing import Any

import numpy as np
import pytest

from ember.data import Dataset, load_dataset
from ember_lab.bench.mllib import mllib_frames, run_mllib

pytestmark = pytest.mark.timeout(120)

ROW_KEYS = {
    "test_accuracy",
    "test_loss",
    "samples",
    "train_seconds",
    "samples_per_second",
    "seconds_per_epoch",
    "time_to_target",
    "samples_to_target",
    "curve",
    "iterations",
    "prepare_seconds",
    "config",
}


@pytest.fixture(scope="module")
def synthetic() -> Dataset:
    return load_dataset("synthetic-lr", seed=0, synthetic_samples=5000, synthetic_features=100)


@pytest.fixture(scope="module")
def small_digits(digits: Dataset) -> Dataset:
    return dataclasses.replace(digits, x_train=digits.x_train[:3000], y_train=digits.y_train[:3000])


def check_row(row: dict[str, Any], rows: int) -> None:
    """The figures every row has, and that they agree with each other and with the curve."""
    assert set(row) == ROW_KEYS
    assert json.loads(json.dumps(row)) == row  # plain JSON values only
    assert row["samples"] == row["iterations"] * rows
    assert row["train_seconds"] > 0 and row["prepare_seconds"] > 0
    assert row["samples_per_second"] == pytest.approx(row["samples"] / row["train_seconds"])
    assert row["seconds_per_epoch"] == pytest.approx(row["train_seconds"] / row["iterations"])
    curve = row["curve"]
    assert curve and all(len(point) == 3 for point in curve)
    assert [p[0] for p in curve] == sorted(p[0] for p in curve)
    assert [p[1] for p in curve] == sorted(p[1] for p in curve)
    assert curve[-1][:2] == [row["train_seconds"], row["samples"]]


def test_frames_hold_the_rows_as_vectors_over_every_slot(spark, monkeypatch, tmp_path) -> None:
    from pyspark.ml.linalg import VectorUDT

    rng = np.random.default_rng(1)
    x = rng.standard_normal((60, 2, 3)).astype(np.float32)  # image-shaped rows get flattened
    y = np.arange(60, dtype=np.int64) % 3
    data = Dataset("tiny", x, y, x[:7].copy(), y[:7].copy(), 3, (2, 3))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    train, test = mllib_frames(spark, data)
    try:
        assert not list(tmp_path.iterdir())  # the Parquet files are gone, the cache serves
        assert isinstance(train.schema["features"].dataType, VectorUDT)
        assert train.schema["label"].dataType.typeName() == "double"
        assert train.rdd.getNumPartitions() >= spark.sparkContext.defaultParallelism
        assert train.storageLevel.useMemory and test.storageLevel.useMemory
        for frame, xs, ys in ((train, x, y), (test, x[:7], y[:7])):
            got = sorted((tuple(r.features.toArray()), r.label) for r in frame.collect())
            flat = xs.reshape(len(xs), -1).astype(np.float64)
            want = sorted((tuple(r), float(v)) for r, v in zip(flat, ys, strict=True))
            assert got == want
    finally:
        train.unpersist()
        test.unpersist()


def test_lr_learns_and_its_curve_is_the_training_loss(spark, synthetic) -> None:
    row = run_mllib(spark, "lr", synthetic, 5, "test_loss", 0.4)
    check_row(row, 5000)
    assert 1 <= row["iterations"] <= 5
    assert row["test_accuracy"] > 0.7  # chance is about 0.5, Bayes accuracy about 0.87
    assert 0 < row["test_loss"] < math.log(2)
    curve = row["curve"]
    assert len(curve) == row["iterations"] + 1  # one point per iteration, then the test loss
    assert curve[-1][2] == row["test_loss"]
    losses = [p[2] for p in curve[:-1]]
    assert losses == sorted(losses, reverse=True) and losses[0] < math.log(2)
    assert [p[1] for p in curve[:-1]] == [5000 * i for i in range(1, row["iterations"] + 1)]
    reached = next(p for p in curve if p[2] <= 0.4)
    assert reached is not curve[0]  # the first iteration does not get there: a real search
    assert [row["time_to_target"], row["samples_to_target"]] == reached[:2]
    config = row["config"]
    assert config["estimator"] == "LogisticRegression"
    assert (config["maxIter"], config["regParam"], config["family"]) == (5, 0.0, "binomial")


def test_lr_never_reaching_its_target_has_no_time_to_target(spark, synthetic) -> None:
    row = run_mllib(spark, "lr", synthetic, 2, "test_loss", 0.0)
    check_row(row, 5000)
    assert row["time_to_target"] is None and row["samples_to_target"] is None


@pytest.mark.parametrize(("task", "target"), [("mlp", 0.0), ("lenet", 1.01)])
def test_mlp_warm_starts_segment_after_segment(spark, small_digits, task, target) -> None:
    row = run_mllib(spark, task, small_digits, 4, "test_accuracy", target, seed=3, segments=2)
    check_row(row, 3000)
    assert row["iterations"] == 4  # L-BFGS does not converge on MNIST in 4 iterations
    curve = row["curve"]
    assert len(curve) == 2 and curve[0][1] == 2 * 3000
    assert curve[-1][2] == row["test_accuracy"]
    # a second fit from the initial weights would repeat the first exactly (same seed, same
    # budget of 2): a different accuracy shows it went on from the first fit's weights
    assert curve[0][2] != curve[1][2]
    assert 0 < row["test_loss"] < math.log(10)
    if target == 0.0:
        assert [row["time_to_target"], row["samples_to_target"]] == curve[0][:2]
    else:
        assert row["time_to_target"] is None and row["samples_to_target"] is None
    config = row["config"]
    assert config["estimator"] == "MultilayerPerceptronClassifier"
    assert config["layers"] == [784, 256, 256, 10]
    assert (config["maxIter"], config["segments"], config["seed"]) == (4, 2, 3)


@pytest.mark.parametrize(
    ("task", "metric", "max_iter", "segments", "message"),
    [
        ("svm", "test_accuracy", 4, 1, r"unknown MLlib bench task 'svm'; expected one of lr, "),
        ("mlp", "test_f1", 4, 1, r"unknown target metric 'test_f1'"),
        ("mlp", "test_accuracy", 2, 3, r"1 <= segments <= max_iter, got 2 and 3"),
        ("mlp", "test_accuracy", 0, 1, r"max_iter >= 1"),
        ("lr", "test_loss", 4, 1, r"task 'lr' needs binary labels, but dataset digits has 10 "),
    ],
)
def test_bad_arguments_fail_before_any_spark_work(
    digits, task, metric, max_iter, segments, message
) -> None:
    with pytest.raises(ValueError, match=message):
        run_mllib(None, task, digits, max_iter, metric, 0.5, segments=segments)
