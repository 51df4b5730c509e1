"""ember in Spark ML: an EmberEstimator in a Pipeline, tuned, saved, loaded and scoring."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import ember
from ember.errors import CheckpointError, ConfigError

pytestmark = pytest.mark.timeout(300)  # each fit is a whole run on two shared cores
PIXELS = [f"p{i}" for i in range(196)]


def pixel_frame(spark: Any, x: np.ndarray, y: np.ndarray, test: bool) -> Any:
    """MNIST images pooled to 14x14, one column per pixel (as a VectorAssembler's users have
    them), a `digit` label and an `is_test` flag."""
    raw = (x * 0.3081 + 0.1307).reshape(len(x), 14, 2, 14, 2).mean(axis=(2, 4))
    columns = {name: raw.reshape(len(x), -1)[:, i] for i, name in enumerate(PIXELS)}
    flag = pa.array(np.full(len(x), test))
    return spark.createDataFrame(
        pa.table({**columns, "digit": y.astype(np.int32), "is_test": flag})
    )


@pytest.fixture(scope="module")
def frames(spark: Any, digits: Any) -> tuple[Any, Any]:
    """All rows (training and test, told apart by is_test) and the test rows alone."""
    train = pixel_frame(spark, digits.x_train, digits.y_train, False)
    test = pixel_frame(spark, digits.x_test, digits.y_test, True)
    return train.unionByName(test).cache(), test.cache()


def pipeline(**params: Any) -> Any:
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import StandardScaler, VectorAssembler

    estimator = ember.spark.EmberEstimator(
        labelCol="digit", validationIndicatorCol="is_test", workers=2, **params
    )
    return Pipeline(
        stages=[
            VectorAssembler(inputCols=PIXELS, outputCol="pixels"),
            StandardScaler(inputCol="pixels", outputCol="features"),
            estimator,
        ]
    )


def accuracy(frame: Any) -> float:
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator

    evaluator = MulticlassClassificationEvaluator(labelCol="digit", metricName="accuracy")
    return float(evaluator.evaluate(frame))


def log_loss(frame: Any) -> float:
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator

    # eps: Spark clips each probability below at eps (1e-15 by default) and the run's loss,
    # taken from the logits, does not; a confident model's misses fall below 1e-15
    evaluator = MulticlassClassificationEvaluator(
        labelCol="digit", metricName="logLoss", eps=1e-300
    )
    return float(evaluator.evaluate(frame))


@pytest.fixture(scope="module")
def mnist_frames(spark: Any) -> Iterator[tuple[Any, Any]]:
    """As `frames`, of all 70,000 MNIST images."""
    from ember.data import load_dataset

    mnist = load_dataset("mnist")
    train = pixel_frame(spark, mnist.x_train, mnist.y_train, False)
    test = pixel_frame(spark, mnist.x_test, mnist.y_test, True)
    # cached: the scaler's fit, the run's row checks and its training each read every row
    frames = train.unionByName(test).cache(), test.cache()
    yield frames
    for frame in frames:  # the shared session's heap goes back to the tests after these
        frame.unpersist(blocking=True)


@pytest.fixture(scope="module")
def fitted(mnist_frames: tuple[Any, Any], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A pipeline fit on all of MNIST's training images, scored on its 10,000 test images."""
    run = tmp_path_factory.mktemp("pipeline") / "run"
    fields = {"out": str(run), "optimizer": "adam"}
    return pipeline(strategy="bsp", epochs=6, lr=1e-3, runFields=fields).fit(mnist_frames[0])


@pytest.mark.timeout(900)  # the fit on MNIST, on two shared cores
def test_a_pipeline_trains_and_its_transform_scores_as_the_run_did(fitted, mnist_frames) -> None:
    from pyspark.ml.linalg import VectorUDT

    model = fitted.stages[-1]
    assert isinstance(model, ember.spark.EmberModel)
    assert (model.run_dir / "model.safetensors").is_file()
    summary = model.summary
    assert summary["engine"] == "spark" and summary["test_accuracy"] >= 0.97
    test = mnist_frames[1]
    scored = fitted.transform(test)
    assert set(test.columns) < set(scored.columns)  # the input's columns are all kept
    types = {f.name: f.dataType for f in scored.schema.fields}
    assert types["prediction"].simpleString() == "double"
    assert isinstance(types["probability"], VectorUDT)
    # the run scored exactly the is_test rows, with the same model: the same accuracy, and
    # Spark's log loss over the probability vectors is the run's mean cross-entropy
    assert abs(accuracy(scored) - summary["test_accuracy"]) <= 1 / test.count()
    assert log_loss(scored) == pytest.approx(summary["test_loss"], abs=1e-4)
    row = scored.select("prediction", "probability").first()
    assert len(row.probability) == 10 and abs(float(row.probability.toArray().sum()) - 1) < 1e-6
    assert row.prediction == float(np.argmax(row.probability.toArray()))


def test_an_ember_model_scores_an_array_column_as_torch_does(fitted, spark, digits) -> None:
    import torch
    from pyspark.ml.functions import vector_to_array

    model = fitted.stages[-1]
    features = fitted.transform(pixel_frame(spark, digits.x_test[:300], digits.y_test[:300], True))
    arrays = features.select(vector_to_array("features", "float32").alias("values"))
    scored = model.copy({model.featuresCol: "values"}).transform(arrays).collect()  # 300 rows
    x = torch.tensor(np.array([r["values"] for r in scored], dtype=np.float32))
    expected = model.torch_model()(x).argmax(dim=1).numpy()
    assert [r["prediction"] for r in scored] == expected.astype(float).tolist()


@pytest.mark.timeout(900)  # five whole runs: two candidates on two folds, and the refit
def test_cross_validator_over_tau_picks_one_and_its_model_transforms(
    frames, tmp_path, monkeypatch
) -> None:
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

    monkeypatch.chdir(tmp_path)  # each fit writes its own runs/<timestamp>-... directory
    flow = pipeline(strategy="easgd-async", epochs=1)
    estimator = flow.getStages()[-1]
    grid = ParamGridBuilder().addGrid(estimator.tau, [1, 16]).build()
    evaluator = MulticlassClassificationEvaluator(labelCol="digit", metricName="accuracy")
    tuned = CrossValidator(
        estimator=flow, estimatorParamMaps=grid, evaluator=evaluator, numFolds=2, seed=1
    ).fit(frames[0])
    metrics = tuned.avgMetrics
    assert len(metrics) == 2 and all(m > 0.5 for m in metrics)
    best = tuned.bestModel.stages[-1]
    assert best.getOrDefault("tau") == [1, 16][int(np.argmax(metrics))]
    assert best.summary["config"]["tau"] == best.getOrDefault("tau")
    assert len(list((tmp_path / "runs").iterdir())) == 5  # 2 candidates x 2 folds, the refit
    assert accuracy(tuned.transform(frames[1])) > 0.8


def test_a_saved_pipeline_model_loads_and_predicts_the_same(fitted, frames, tmp_path) -> None:
    from pyspark.ml import PipelineModel

    fitted.save(str(tmp_path / "pipeline"))
    stage = next((tmp_path / "pipeline" / "stages").glob("2_*"))
    assert sorted(p.name for p in (stage / "model").iterdir()) == [
        "model.json",
        "model.safetensors",
    ]
    loaded = PipelineModel.load(str(tmp_path / "pipeline"))
    model = loaded.stages[-1]
    assert isinstance(model, ember.spark.EmberModel) and model.getLabelCol() == "digit"
    columns = ["prediction", "probability"]
    before = fitted.transform(frames[1]).select(*columns).collect()
    after = loaded.transform(frames[1]).select(*columns).collect()
    assert before == after
    # and one model alone
    model.save(str(tmp_path / "alone"))
    alone = ember.spark.EmberModel.load(str(tmp_path / "alone"))
    assert alone.transform(fitted.transform(frames[1])).select(*columns).collect() == before


def test_a_saved_estimator_loads_with_its_params(spark, tmp_path) -> None:
    estimator = ember.spark.EmberEstimator(model="lenet", tau=3, runFields={"servers": 2})
    estimator.save(str(tmp_path / "estimator"))
    loaded = ember.spark.EmberEstimator.load(str(tmp_path / "estimator"))
    assert loaded.run_fields() == estimator.run_fields()
    assert loaded.getOrDefault("model") == "lenet"


def damage_weights(folder: Path) -> None:
    weights = folder / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def damage_description(folder: Path) -> None:
    (folder / "model" / "model.json").write_text('{"format": "something else"}')


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (damage_weights, r"model\.safetensors: cannot read"),
        (damage_description, r"model\.json: not an ember model description"),
    ],
)
def test_a_damaged_saved_model_is_one_clear_error(fitted, tmp_path, damage, expected) -> None:
    from pyspark.ml import PipelineModel

    fitted.save(str(tmp_path / "pipeline"))
    stage = next((tmp_path / "pipeline" / "stages").glob("2_*"))
    damage(stage)
    with pytest.raises(CheckpointError, match=expected):
        ember.spark.EmberModel.load(str(stage))
    with pytest.raises(CheckpointError, match=expected):
        PipelineModel.load(str(tmp_path / "pipeline"))


def test_a_saved_model_without_its_metadata_is_one_clear_error(fitted, tmp_path) -> None:
    from pyspark.errors import AnalysisException
    from pyspark.ml import PipelineModel

    fitted.save(str(tmp_path / "pipeline"))
    stage = next((tmp_path / "pipeline" / "stages").glob("2_*"))
    shutil.rmtree(stage / "metadata")
    with pytest.raises(
        CheckpointError, match="not a saved EmberModel: its metadata cannot be read"
    ):
        ember.spark.EmberModel.load(str(stage))
    # the pipeline reads a stage's metadata before it knows the stage's class: Spark's error
    with pytest.raises(AnalysisException, match=r"PATH_NOT_FOUND.*EmberEstimator_\w+/metadata"):
        PipelineModel.load(str(tmp_path / "pipeline"))


def test_a_foreign_directory_is_not_loaded_as_an_ember_model(spark, tmp_path) -> None:
    from pyspark.ml.feature import VectorAssembler

    VectorAssembler(inputCols=["a"], outputCol="v").save(str(tmp_path / "assembler"))
    with pytest.raises(
        CheckpointError, match=r"its metadata names 'org\.apache\.spark\.ml\.feature"
    ):
        ember.spark.EmberModel.load(str(tmp_path / "assembler"))


def test_bad_params_are_refused_naming_them() -> None:
    with pytest.raises(ConfigError, match=r"EmberEstimator has no param 'taus'; its params: "):
        ember.spark.EmberEstimator(taus=3)
    with pytest.raises(ConfigError, match=r"runFields: .*workers \(use the workers param\)"):
        ember.spark.EmberEstimator(runFields={"workers": 3})
    with pytest.raises(ConfigError, match=r"model must be a name, 'package\.module:factory'"):
        ember.spark.EmberEstimator(model=lambda input_shape, num_classes: None)


@pytest.fixture(scope="module")
def regression_rows(spark: Any) -> Any:
    """8 features in a vector column, a double label linear in them with a little noise, and
    an is_test flag on a fifth of the rows."""
    from pyspark.ml.linalg import Vectors

    rng = np.random.default_rng(3)
    x = rng.normal(size=(3000, 8))
    y = x @ rng.normal(size=8) + 0.1 * rng.normal(size=3000)
    rows = [
        (Vectors.dense(f), float(t), i % 5 == 0) for i, (f, t) in enumerate(zip(x, y, strict=True))
    ]
    return spark.createDataFrame(rows, ["features", "y", "is_test"]).cache()


def test_a_regression_estimator_reports_rmse_through_regression_evaluator(
    regression_rows, tmp_path
) -> None:
    from pyspark.ml.evaluation import RegressionEvaluator

    estimator = ember.spark.EmberEstimator(
        loss="mse",
        labelCol="y",
        validationIndicatorCol="is_test",
        strategy="bsp",
        workers=2,
        epochs=3,
        lr=1e-3,
        runFields={"out": str(tmp_path / "run"), "optimizer": "adam"},
    )
    model = estimator.fit(regression_rows)
    summary = model.summary
    assert summary["loss"] == "mse" and summary["test_rmse"] < 0.5  # the labels' std is ~3
    test = regression_rows.filter("is_test")
    scored = model.transform(test)
    types = {f.name: f.dataType.simpleString() for f in scored.schema.fields}
    assert types["prediction"] == "double" and "probability" not in types
    rmse = RegressionEvaluator(labelCol="y", metricName="rmse").evaluate(scored)
    assert rmse == pytest.approx(summary["test_rmse"], rel=1e-4)


def test_regression_labels_that_are_not_finite_are_refused_naming_the_column(spark) -> None:
    rows = [([1.0, 2.0], 0.5), ([3.0, 4.0], float("nan"))] * 20
    df = spark.createDataFrame(rows, ["features", "y"])
    with pytest.raises(ConfigError, match=r"column 'y' has \d+ labels that are NaN or Inf"):
        ember.spark.fit(df=df, label_col="y", loss="mse", strategy="bsp", workers=2)


def test_an_estimator_fit_in_an_active_mlflow_run_logs_one_child_run(
    regression_rows, tmp_path, monkeypatch
) -> None:
    import torch

    mlflow = pytest.importorskip("mlflow", reason="pip install -e '.[mlflow]' (in dev too)")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow 3 asks for a database
    mlflow.set_tracking_uri((tmp_path / "mlruns").as_uri())
    experiment = mlflow.set_experiment("ember-spark").experiment_id
    estimator = ember.spark.EmberEstimator(
        loss="mse", labelCol="y", validationIndicatorCol="is_test", strategy="bsp", workers=2,
        epochs=1, runFields={"out": str(tmp_path / "run")},
    )  # fmt: skip
    try:
        with mlflow.start_run() as parent:
            model = estimator.fit(regression_rows)
        runs = mlflow.MlflowClient().search_runs([experiment])
        logged = model.summary["mlflow"]
        child = next(r for r in runs if r.info.run_id != parent.info.run_id)
        assert len(runs) == 2 and child.info.run_id == logged["run_id"]  # one run per fit
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.data.params["loss"] == "mse" and child.data.params["engine"] == "spark"
        assert child.data.metrics["test_rmse"] == pytest.approx(model.summary["test_rmse"])
        x = torch.randn(5, 8)
        with torch.no_grad():
            expected = model.torch_model()(x)
            assert torch.allclose(mlflow.pytorch.load_model(logged["model_uri"])(x), expected)
    finally:
        mlflow.set_tracking_uri(None)
