"""Multi-output regression on a DataFrame: a label column of arrays trains a model with one
output per value, and transform hands back an array per row."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

import ember
from ember.errors import ConfigError

pytestmark = pytest.mark.timeout(300)  # a whole run on two shared cores
OUTPUTS = 3


@pytest.fixture(scope="module")
def rows(spark: Any) -> Any:
    """y = x W + noise, three targets per row as array<double>; every fifth row is a test row."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(3000, 8)).astype(np.float32)
    y = x @ rng.normal(size=(8, OUTPUTS)) + 0.1 * rng.normal(size=(3000, OUTPUTS))
    features = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 8)
    targets = pa.ListArray.from_arrays(pa.array(np.arange(0, y.size + 1, OUTPUTS, np.int32)),
                                       pa.array(y.reshape(-1)))  # fmt: skip
    flag = pa.array(np.arange(3000) % 5 == 0)
    return spark.createDataFrame(pa.table({"features": features, "y": targets, "is_test": flag}))


def test_an_array_label_trains_one_output_per_value_and_transform_returns_arrays(
    rows, tmp_path
) -> None:
    estimator = ember.spark.EmberEstimator(
        loss="mse", labelCol="y", validationIndicatorCol="is_test", strategy="bsp", workers=2,
        epochs=3, lr=1e-3, runFields={"out": str(tmp_path / "run"), "optimizer": "adam"},
    )  # fmt: skip
    model = estimator.fit(rows)
    summary = model.summary
    assert summary["loss"] == "mse" and summary["test_rmse"] < 0.5  # the targets' std is ~3
    assert model.torch_model()(torch.zeros(1, 8)).shape == (1, OUTPUTS)
    scored = model.transform(rows.filter("is_test"))
    types = {f.name: f.dataType.simpleString() for f in scored.schema.fields}
    assert types["prediction"] == "array<double>" and "probability" not in types
    got = scored.select("prediction", "y").toArrow()
    predicted = np.array(got.column("prediction").to_pylist())
    expected = np.array(got.column("y").to_pylist())
    assert predicted.shape == expected.shape == (600, OUTPUTS)
    rmse = float(np.sqrt(np.mean((predicted - expected) ** 2)))  # over every value, as the run's
    assert rmse == pytest.approx(summary["test_rmse"], rel=1e-4)


@pytest.mark.parametrize(
    ("labels", "loss", "message"),
    [
        ([[0.5, 1.0], [1.0]], "mse", "column 'y' is ragged: its arrays hold between 1 and 2"
         " values"),
        ([[0.5, 1.0], [1.0, float("nan")]], "mse", "column 'y' has 20 rows with a null, NaN or"
         " Inf value"),
        ([[0.5, 1.0], [1.0, 2.0]], "cross_entropy", "column 'y' holds arrays, which a loss whose"
         " targets are values (mse, l1, huber, bce_with_logits) trains on; cross_entropy takes"
         " one class per row"),
    ],
)  # fmt: skip
def test_an_array_label_a_worker_cannot_train_on_is_one_error_naming_the_column(
    spark, labels, loss, message
) -> None:
    df = spark.createDataFrame([([1.0, 2.0], y) for y in labels] * 20, ["features", "y"])
    with pytest.raises(ConfigError) as refused:
        ember.spark.fit(df=df, test_df=df, label_col="y", loss=loss, strategy="bsp", workers=2)
    assert str(refused.value) == message
