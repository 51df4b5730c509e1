"""Horovod on Spark's torch estimator scenarios, re-created with ember.spark.fit and
EmberEstimator on the one local[2] session.

Re-created from horovod/horovod, test/integration/test_spark_torch.py (with the XOR data of
test/utils/spark_common.py's `create_xor_data`: four rows x1, x2 -> y with a `weight` column):
- `test_fit_model`: the XOR model, optimizer and loss handed as objects, two processes,
  sample weights, batch size 1, 3 epochs; the trained module called on a row of ones gives
  one float32 prediction;
- `test_restore_from_checkpoint`: a first fit leaves a checkpoint in the store, and a second
  fit of the same run loads it;
- `test_transform_multi_class`: a two-output XOR model's transform keeps every input column
  with its type and adds vector outputs.

Differences, and why:
- Horovod takes an optimizer instance built on the model's parameters; ember builds one per
  worker from them, so the same SGD(lr=0.1) is handed as `lambda params: SGD(params, lr=0.1)`.
- Horovod has no test set unless asked; ember.spark.fit scores a held-out one, so the four
  rows are also `test_df` (the transform case's estimator holds out a seeded tenth of the
  XOR rows repeated 25 times: a tenth of four rows is none).
- `torch_model.getModel()` is `result.model`; Horovod's checkpoint store and run_id are the
  run's `out` directory, and its mocked `_load_checkpoint` is the second run's
  `resumed_from` and its first step. ember resumes the run's schedule rather than training
  its epochs again, so the second fit asks for 2 epochs where the first had 1.
- Horovod's transform test builds a TorchModel from an untrained module; an EmberModel comes
  from a fit, so the estimator fits one epoch first. Horovod names its output `y__output`
  (a vector); ember adds Spark's own `rawPrediction` and `probability` (vectors) and
  `prediction` (a double), as Spark's classifiers do.
- Horovod's strategy is allreduce; the weights are also checked under bsp and async, and with
  rows that must not count (weight 0, wrong labels), which Horovod's test does not check.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ember
from ember.metrics import read_metrics
from tests.peers.xor import XOR, sgd

pytestmark = pytest.mark.timeout(300)


def xor_frame(spark: Any, repeat: int = 1) -> Any:
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql.types import FloatType, IntegerType, StructField, StructType

    data = [[0, 0, 0.0, 0.1], [0, 1, 1.0, 0.2], [1, 0, 1.0, 0.3], [1, 1, 0.0, 0.4]] * repeat
    schema = StructType(
        [
            StructField("x1", IntegerType()),
            StructField("x2", IntegerType()),
            StructField("y", FloatType()),
            StructField("weight", FloatType()),
        ]
    )
    raw = spark.createDataFrame(data, schema=schema)
    return VectorAssembler().setInputCols(["x1", "x2"]).setOutputCol("features").transform(raw)


def fit_xor(spark: Any, out: Path, **fields: Any) -> Any:
    df = xor_frame(spark)
    settings = {"workers": 2, "batch_size": 1, "epochs": 3, "strategy": "allreduce"}
    return ember.spark.fit(
        model=XOR(),
        df=df,
        test_df=df,
        label_col="y",
        loss=F.binary_cross_entropy,
        optimizer=sgd,
        out=str(out),
        show_progress=False,
        **{**settings, **fields},
    )


def test_fit_model_with_objects_and_sample_weights(spark: Any, tmp_path: Path) -> None:
    result = fit_xor(spark, tmp_path / "run", weight_col="weight")
    pred = result.model(torch.ones([1, 2], dtype=torch.int32))
    assert len(pred) == 1
    assert pred.dtype == torch.float32
    # ember's own: both workers trained their two rows, three times
    assert result.summary["samples"] == 3 * 4


def test_restore_from_checkpoint(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "run"
    checkpoints = out / "checkpoints"
    assert not checkpoints.exists()
    first = fit_xor(spark, out, epochs=1)
    assert (checkpoints / "last").exists()
    trained = [p.detach().clone() for p in first.model.parameters()]
    second = fit_xor(spark, out, epochs=2, resume="auto")
    assert second.summary["resumed_from"] is not None
    assert Path(second.summary["resumed_from"]).parent == checkpoints
    starts = [r for r in read_metrics(out / "metrics.jsonl") if r.get("kind") == "start"]
    # each worker's second incarnation began after its two rows (steps of one row) of the first
    assert first.summary["samples"] == 4
    assert max(r["first_step"] for r in starts) == 2
    moved = [not torch.equal(a, b) for a, b in zip(trained, second.model.parameters(), strict=True)]
    assert any(moved)  # the second fit trained on from the first one's parameters


def test_transform_multi_class(spark: Any, tmp_path: Path) -> None:
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.types import DoubleType, FloatType, IntegerType

    df = xor_frame(spark, repeat=25)
    estimator = ember.spark.EmberEstimator(
        model=XOR(output_dim=2),  # a mock multi-class model, as the peer's
        labelCol="y",
        weightCol="weight",
        workers=2,
        epochs=1,
        batchSize=1,
        runFields={"out": str(tmp_path / "run")},
    )
    out_df = estimator.fit(df).transform(df)
    expected_types = {
        "x1": IntegerType,
        "x2": IntegerType,
        "features": VectorUDT,
        "weight": FloatType,
        "y": FloatType,
        "rawPrediction": VectorUDT,
        "probability": VectorUDT,
        "prediction": DoubleType,
    }
    assert {f.name: type(f.dataType) for f in out_df.schema.fields} == expected_types
    rows = out_df.select("rawPrediction", "probability").collect()
    assert {len(r.rawPrediction) for r in rows} == {2}
    np.testing.assert_allclose([sum(r.probability) for r in rows], 1.0, rtol=1e-5)


@pytest.mark.parametrize("strategy", ["bsp", "async"])
def test_rows_of_weight_zero_do_not_train(spark: Any, tmp_path: Path, strategy: str) -> None:
    # every row twice: once with its label and weight 1, once with the other label and weight 0
    from pyspark.ml.linalg import Vectors

    rng = np.random.default_rng(3)
    x = rng.normal(size=(400, 2))
    y = (x[:, 0] + x[:, 1] > 0).astype(int)
    rows = [(Vectors.dense(f), int(t), 1.0) for f, t in zip(x, y, strict=True)]
    rows += [(Vectors.dense(f), 1 - int(t), 0.0) for f, t in zip(x, y, strict=True)]
    df = spark.createDataFrame(rows, ["features", "label", "weight"])
    test_df = spark.createDataFrame(rows[:400], ["features", "label", "weight"])
    result = ember.spark.fit(
        model="logreg",
        df=df,
        test_df=test_df,
        weight_col="weight",
        strategy=strategy,
        workers=2,
        epochs=4,
        lr=0.5,
        out=str(tmp_path / "run"),
        show_progress=False,
    )
    assert result.summary["test_accuracy"] >= 0.95
