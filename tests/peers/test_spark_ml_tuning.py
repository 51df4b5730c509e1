"""Spark's own save/load scenarios of tuning and persistence, re-created with EmberEstimator as
the estimator class, and tuning with `parallelism > 1` on the one local[2] session.

Re-created from apache/spark, python/pyspark/ml/tests/:
- tuning/test_cv_io_basic.py: `_run_test_save_load_trained_model` (the best model and the
  CrossValidatorModel saved and loaded, the params and subModels kept) and
  `_run_test_save_load_simple_estimator` (the CrossValidator and its model);
- tuning/test_tvs_io_basic.py: the same two for TrainValidationSplit;
- test_persistence.py: `test_default_read_write` (uid and extractParamMap kept, overwrite),
  `test_default_read_write_default_params` (set and default params stay apart, the metadata
  has a defaultParamMap), `test_decisiontree_classifier` (a loaded estimator's params name
  its uid) and `test_pipeline_persistence` with its `_compare_pipelines` (uid, class, values,
  parents), a Pipeline and a PipelineModel holding the ember stage.

Differences, and why:
- The peers grid `maxIter` over [0, 1]; an ember run has no 0 epochs (ember refuses it), so
  the grid is `lr` over two values at epochs=1, each a whole run on two shared cores.
- The peers' data are 50 rows of one feature; ember's two workers each need a batch, so it is
  200 rows of two features, and batchSize=16.
- `numFolds=4` becomes 2, and the CrossValidator and TrainValidationSplit are each fit once
  (with parallelism=2 and collectSubModels=True) for both peer scenarios: the "simple
  estimator" one fits again without collectSubModels, which would only add runs.
- `lrModel.intercept` (the peers' check that the loaded model is the trained one) becomes
  the loaded model's transform equal to the trained one's: an EmberModel has no intercept.
- The peers' DummyLogisticRegression and DummyEvaluator variants are Spark's own stand-ins
  for a Python estimator; EmberEstimator is one, so they are not repeated.
- The peers' `cvModel2.stdMetrics = []` case (loading a model written by an older Spark) is
  about CrossValidatorModel alone, nothing of the estimator's: not repeated.
- The peers' HashingTF/PCA pipeline becomes a VectorAssembler then EmberEstimator.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ember

pytestmark = pytest.mark.timeout(300)  # a tuning fit is several whole runs on two shared cores
RATES = [0.05, 0.2]


@pytest.fixture(scope="module")
def rows(spark: Any) -> Any:
    from pyspark.ml.linalg import Vectors

    rng = np.random.default_rng(7)
    x = rng.normal(size=(200, 2))
    y = (x[:, 0] > x[:, 1]).astype(float)
    data = [(Vectors.dense(f), float(t)) for f, t in zip(x, y, strict=True)]
    return spark.createDataFrame(data, ["features", "label"]).cache()


def candidate(**params: Any) -> Any:
    # no `out`: each fit of the tuning writes its own runs/<timestamp>-... directory
    fields = {"model": "logreg", "strategy": "bsp", "workers": 2, "epochs": 1, "batchSize": 16}
    return ember.spark.EmberEstimator(**{**fields, **params})


def grid(estimator: Any) -> list[dict[Any, Any]]:
    from pyspark.ml.tuning import ParamGridBuilder

    return ParamGridBuilder().addGrid(estimator.lr, RATES).build()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tuning")


def tune(kind: Any, rows: Any, folder: Path, **params: Any) -> tuple[Any, Any]:
    """A tuning of `kind` over the two rates, two fits at a time and every sub-model kept,
    fit in `folder` (each fit writes runs/<timestamp>-... there), and the model it returns."""
    from pyspark.ml.evaluation import BinaryClassificationEvaluator

    estimator = candidate()
    validator = kind(
        estimator=estimator, estimatorParamMaps=grid(estimator),
        evaluator=BinaryClassificationEvaluator(), seed=42, parallelism=2,
        collectSubModels=True, **params,
    )  # fmt: skip
    folder.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        return validator, validator.fit(rows)


@pytest.fixture(scope="module")
def cross_validated(rows: Any, runs: Path) -> tuple[Any, Any]:
    from pyspark.ml.tuning import CrossValidator

    return tune(CrossValidator, rows, runs / "cv", numFolds=2)


@pytest.fixture(scope="module")
def split_validated(rows: Any, runs: Path) -> tuple[Any, Any]:
    from pyspark.ml.tuning import TrainValidationSplit

    return tune(TrainValidationSplit, rows, runs / "tvs")


def assert_same_stage(a: Any, b: Any) -> None:
    """_compare_pipelines' check of one stage: uid, class, each defined param's value and
    parent, and an undefined param undefined in both."""
    assert (a.uid, type(a)) == (b.uid, type(b))
    assert len(a.params) == len(b.params)
    for param in a.params:
        other = b.getParam(param.name)
        assert a.isDefined(param) == b.isDefined(other), param.name
        if a.isDefined(param):
            assert a.getOrDefault(param) == b.getOrDefault(other), param.name
            assert param.parent == a.uid and other.parent == b.uid


def scores(model: Any, rows: Any) -> list[Any]:
    return model.transform(rows).select("rawPrediction", "prediction").collect()


def test_cross_validator_with_parallelism_finishes_with_every_sub_model(
    cross_validated, runs
) -> None:
    _, tuned = cross_validated
    assert len(tuned.avgMetrics) == 2 and all(0 <= m <= 1 for m in tuned.avgMetrics)
    assert [len(fold) for fold in tuned.subModels] == [2, 2]
    rates = [[m.getOrDefault("lr") for m in fold] for fold in tuned.subModels]
    assert rates == [RATES, RATES]
    # one fit at a time: every fit, and the refit of the best, has a run directory of its own
    assert len(list((runs / "cv" / "runs").iterdir())) == 5
    assert tuned.bestModel.getOrDefault("lr") == RATES[int(np.argmax(tuned.avgMetrics))]


def test_train_validation_split_with_parallelism_finishes_with_every_sub_model(
    split_validated, runs
) -> None:
    _, tuned = split_validated
    assert len(tuned.validationMetrics) == 2 and len(tuned.subModels) == 2
    assert [m.getOrDefault("lr") for m in tuned.subModels] == RATES
    assert len(list((runs / "tvs" / "runs").iterdir())) == 3


@pytest.mark.parametrize("validated", ["cross_validated", "split_validated"])
def test_a_tuned_best_model_and_the_tuned_model_save_and_load(
    request, validated, rows, tmp_path
) -> None:
    """_run_test_save_load_trained_model of test_cv_io_basic.py and test_tvs_io_basic.py."""
    from pyspark.ml.tuning import CrossValidatorModel, TrainValidationSplitModel

    validator, tuned = request.getfixturevalue(validated)
    best = tuned.bestModel
    best.save(str(tmp_path / "best"))
    loaded = type(best).load(str(tmp_path / "best"))
    assert loaded.uid == best.uid
    assert scores(loaded, rows) == scores(best, rows)  # the peers: the intercept

    kind = CrossValidatorModel if validated == "cross_validated" else TrainValidationSplitModel
    tuned.save(str(tmp_path / "tuned"))
    again = kind.load(str(tmp_path / "tuned"))
    assert again.getSeed() == tuned.getSeed()
    if kind is CrossValidatorModel:
        assert (again.getNumFolds(), again.getFoldCol()) == (tuned.getNumFolds(), "")
        assert [len(f) for f in again.subModels] == [len(f) for f in tuned.subModels]
    else:
        assert again.getTrainRatio() == tuned.getTrainRatio()
    assert all(again.isSet(param) for param in again.params)  # SPARK-32092
    assert again.bestModel.uid == tuned.bestModel.uid  # _run_test_save_load_simple_estimator
    assert_same_stage(tuned.bestModel, again.bestModel)

    # the tuning estimator itself: its estimator, evaluator and param maps
    validator.save(str(tmp_path / "validator"))
    same = type(validator).load(str(tmp_path / "validator"))
    assert same.getEstimator().uid == validator.getEstimator().uid
    assert_same_stage(validator.getEstimator(), same.getEstimator())
    assert same.getEvaluator().uid == validator.getEvaluator().uid
    maps = [{p.name: v for p, v in m.items()} for m in same.getEstimatorParamMaps()]
    assert maps == [{"lr": rate} for rate in RATES]


def test_default_read_write_keeps_uid_params_and_overwrites(spark, tmp_path) -> None:
    """test_default_read_write and test_decisiontree_classifier of test_persistence.py."""
    from pyspark.ml.util import DefaultParamsReadable, DefaultParamsWriter

    estimator = candidate(epochs=3, tau=2)
    path = str(tmp_path / "estimator")
    DefaultParamsWriter(estimator).save(path)
    loaded = DefaultParamsReadable.read().load(path)
    assert loaded.uid == estimator.uid and loaded.uid == loaded.tau.parent
    assert loaded.extractParamMap() == estimator.extractParamMap()
    assert loaded._defaultParamMap[loaded.lr] == estimator._defaultParamMap[estimator.lr]
    estimator.setParams(tau=5)
    DefaultParamsWriter(estimator).overwrite().save(path)
    again = DefaultParamsReadable.read().load(path)
    assert again.uid == estimator.uid and again.extractParamMap() == estimator.extractParamMap()


def test_default_read_write_keeps_set_and_default_params_apart(spark, tmp_path) -> None:
    """test_default_read_write_default_params of test_persistence.py."""
    from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter

    estimator = candidate()
    assert not estimator.isSet(estimator.tau) and estimator.hasDefault(estimator.tau)
    estimator.setParams(tau=3)
    path = str(tmp_path / "estimator")
    DefaultParamsWriter(estimator).save(path)
    metadata = json.loads(next((Path(path) / "metadata").glob("part-00000*")).read_text())
    assert "defaultParamMap" in metadata and metadata["paramMap"]["tau"] == 3
    loaded = DefaultParamsReader(ember.spark.EmberEstimator).load(path)
    assert loaded.isSet(loaded.tau) and not loaded.isSet(loaded.predictionCol)
    assert loaded.hasDefault(loaded.predictionCol)
    del metadata["defaultParamMap"]
    with pytest.raises(AssertionError, match="`defaultParamMap` section not found"):
        DefaultParamsReader.getAndSetParams(loaded, metadata)


def test_a_pipeline_and_its_model_save_and_load_as_they_were(
    cross_validated, rows, tmp_path
) -> None:
    """test_pipeline_persistence of test_persistence.py, the ember stage in place of PCA."""
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import VectorAssembler

    assembler = VectorAssembler(inputCols=["features"], outputCol="assembled")
    estimator = candidate(featuresCol="assembled")
    Pipeline(stages=[assembler, estimator]).save(str(tmp_path / "pipeline"))
    stages = Pipeline.load(str(tmp_path / "pipeline")).getStages()
    assert [s.uid for s in stages] == [assembler.uid, estimator.uid]
    assert_same_stage(estimator, stages[1])
    # a fitted pipeline's model, without another run: the tuned best model as its stage
    tuned = cross_validated[1].bestModel
    best = tuned.copy({tuned.featuresCol: "assembled"})
    model = PipelineModel(stages=[assembler, best])
    model.save(str(tmp_path / "model"))
    loaded = PipelineModel.load(str(tmp_path / "model"))
    assert [s.uid for s in loaded.stages] == [assembler.uid, best.uid]
    assert_same_stage(best, loaded.stages[1])
    assert scores(loaded, rows) == scores(model, rows)
