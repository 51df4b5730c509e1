"""EmberEstimator and EmberModel side by side with Spark's LogisticRegression: each test asserts
one Spark ML convention of both, so that ember keeps it as Spark's own classifiers do.

Where ember differs, and why:
- LogisticRegression is the multinomial family here: ember's classifiers are a softmax over
  one output per class, and their rawPrediction the centred logits, as that family's margins.
- A module instance as `model` trains, but a stage holding one is not saved: Spark ML
  persistence writes params as JSON, and ember pickles nothing.
- Not kept yet: LogisticRegression's per-param setters (setFeaturesCol, ...; ember's stages
  take setParams), its model's numClasses and numFeatures, and hasSummary (an EmberModel's
  `summary` is the run's, None once loaded)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ember
from ember.errors import ConfigError

pytestmark = pytest.mark.timeout(300)  # each ember fit is a whole run on two shared cores
KINDS = ["LogisticRegression", "EmberEstimator"]


def estimator(kind: str, out: Path, **params: Any) -> Any:
    """A classifier of each kind, a few params set, the rest left at their defaults."""
    from pyspark.ml.classification import LogisticRegression

    if kind == "LogisticRegression":
        # multinomial: a softmax over one output per class, as ember's classifiers are (the
        # binomial family's rawPrediction is [-m, m] with probability sigmoid(m), not softmax)
        return LogisticRegression(maxIter=5, family="multinomial", **params)
    fields = {"out": str(out)}  # one fit per estimator: its own run directory
    return ember.spark.EmberEstimator(
        model="logreg", strategy="bsp", workers=2, epochs=1, batchSize=16, lr=0.1,
        runFields=fields, **params,
    )  # fmt: skip


@pytest.fixture(scope="module")
def binary_rows(spark: Any) -> Any:
    """400 rows of 4 features, the label 1 where the first two sum above 0: separable."""
    from pyspark.ml.linalg import Vectors

    rng = np.random.default_rng(5)
    x = rng.normal(size=(400, 4))
    y = (x[:, 0] + x[:, 1] > 0).astype(float)
    rows = [(Vectors.dense(f), float(t)) for f, t in zip(x, y, strict=True)]
    return spark.createDataFrame(rows, ["features", "label"]).cache()


@pytest.fixture(scope="module")
def fitted(binary_rows: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each kind's estimator and the model it fit, once for the module."""
    out = tmp_path_factory.mktemp("conventions")
    pairs = {}
    for kind in KINDS:
        made = estimator(kind, out / kind)
        pairs[kind] = made, made.fit(binary_rows)
    return pairs


def assert_same_params(a: Any, b: Any) -> None:
    """As Spark's persistence tests compare two stages: uid, class, and each param's value,
    parent, and whether it is set or a default."""
    assert (a.uid, type(a)) == (b.uid, type(b))
    assert sorted(p.name for p in a.params) == sorted(p.name for p in b.params)
    for param in a.params:
        other = b.getParam(param.name)
        assert (a.isSet(param), a.hasDefault(param)) == (b.isSet(other), b.hasDefault(other))
        assert a.isDefined(param) == b.isDefined(other)
        if a.isDefined(param):
            assert a.getOrDefault(param) == b.getOrDefault(other), param.name
        assert (param.parent, other.parent) == (a.uid, b.uid)


@pytest.mark.parametrize("kind", KINDS)
def test_a_fitted_model_takes_its_estimators_uid_and_params(fitted, kind) -> None:
    made, model = fitted[kind]
    assert model.uid == made.uid
    assert {p.name for p in made.params} <= {p.name for p in model.params}
    for param in made.params:
        own = model.getParam(param.name)
        assert (model.isSet(own), model.hasDefault(own)) == (
            made.isSet(param),
            made.hasDefault(param),
        )
        if made.isDefined(param):
            assert model.getOrDefault(own) == made.getOrDefault(param), param.name
    # Spark's Python models keep no reference to their estimator (the JVM's have `parent`)
    assert not hasattr(model, "parent")


@pytest.mark.parametrize("kind", KINDS)
def test_copy_with_extra_params_sets_them_on_the_copy_alone(fitted, kind) -> None:
    for stage in fitted[kind]:
        copied = stage.copy({stage.predictionCol: "guess"})
        assert type(copied) is type(stage) and copied.uid == stage.uid
        assert copied.getPredictionCol() == "guess" and copied.isSet(copied.predictionCol)
        assert stage.getPredictionCol() == "prediction" and not stage.isSet(stage.predictionCol)
        assert copied.getOrDefault("labelCol") == stage.getOrDefault("labelCol")


@pytest.mark.parametrize("kind", KINDS)
def test_params_are_set_or_defaults_as_sparks_are(kind, tmp_path) -> None:
    made = estimator(kind, tmp_path)
    column = made.featuresCol
    assert not made.isSet(column) and made.hasDefault(column) and made.isDefined(column)
    assert made.getOrDefault(column) == "features"
    made.setParams(featuresCol="x")
    assert made.isSet(column) and made.getOrDefault(column) == "x"
    made.clear(column)
    assert not made.isSet(column) and made.getOrDefault(column) == "features"
    params = made.extractParamMap()
    assert params[made.rawPredictionCol] == "rawPrediction"  # a default is in the map
    assert params[made.probabilityCol] == "probability"
    extra = made.extractParamMap({made.labelCol: "y"})
    assert extra[made.labelCol] == "y" and made.getOrDefault(made.labelCol) == "label"


@pytest.mark.parametrize("kind", KINDS)
def test_every_param_has_a_chaining_setter_and_a_getter(kind, tmp_path, fitted) -> None:
    made = estimator(kind, tmp_path)
    for stage in (made, fitted[kind][1]):  # the estimator, and a model (some params)
        for param in stage.params:
            title = param.name[0].upper() + param.name[1:]
            getter = getattr(stage, f"get{title}", None)
            if getter is not None and stage.isDefined(param):
                assert getter() == stage.getOrDefault(param), param.name
    shared = {"featuresCol": "x", "labelCol": "y", "weightCol": "w", "predictionCol": "p"}
    for name, value in shared.items():
        title = name[0].upper() + name[1:]
        assert getattr(made, f"set{title}")(value) is made  # the setters chain
        assert getattr(made, f"get{title}")() == value
    if kind == "EmberEstimator":
        made.setEpochs(3).setLr(0.5).setStrategy("async")
        assert (made.getEpochs(), made.getLr(), made.getStrategy()) == (3, 0.5, "async")


@pytest.mark.parametrize("kind", KINDS)
def test_explain_params_has_one_line_per_param_in_sparks_form(kind, tmp_path) -> None:
    made = estimator(kind, tmp_path)
    lines = made.explainParams().splitlines()
    names = [line.split(":")[0] for line in lines]
    assert names == sorted(p.name for p in made.params)
    form = re.compile(r"^\w+: .+ \((undefined|default: .+?(, current: .+)?|current: .+)\)$")
    assert all(form.match(line) for line in lines), lines
    assert "featuresCol: features column name. (default: features)" in lines
    changed = made.copy({made.featuresCol: "x"}).explainParams().splitlines()
    assert "featuresCol: features column name. (default: features, current: x)" in changed


@pytest.mark.parametrize("kind", KINDS)
def test_estimator_model_and_pipelines_save_and_load_as_they_were(
    fitted, binary_rows, kind, tmp_path
) -> None:
    from pyspark.ml import Pipeline, PipelineModel

    made, model = fitted[kind]
    made = made.copy({made.probabilityCol: "p"})
    made.save(str(tmp_path / "estimator"))
    assert_same_params(made, type(made).load(str(tmp_path / "estimator")))
    changed = made.copy({made.labelCol: "y"})
    with pytest.raises(Exception, match="already exists"):  # Spark's message, from the JVM
        changed.save(str(tmp_path / "estimator"))
    changed.write().overwrite().save(str(tmp_path / "estimator"))
    assert_same_params(changed, type(made).load(str(tmp_path / "estimator")))

    model.save(str(tmp_path / "model"))
    loaded = type(model).load(str(tmp_path / "model"))
    assert_same_params(model, loaded)
    # the model's shape, and a summary after the fit but not after a load, as Spark's
    assert (model.numClasses, model.numFeatures) == (loaded.numClasses, loaded.numFeatures)
    assert (model.numClasses, model.numFeatures) == (2, 4)
    assert model.hasSummary and not loaded.hasSummary
    columns = ["rawPrediction", "probability", "prediction"]
    expected = model.transform(binary_rows).select(*columns).collect()
    assert loaded.transform(binary_rows).select(*columns).collect() == expected

    Pipeline(stages=[made]).save(str(tmp_path / "pipeline"))
    stages = Pipeline.load(str(tmp_path / "pipeline")).getStages()
    assert len(stages) == 1 and assert_same_params(made, stages[0]) is None
    PipelineModel(stages=[model]).write().overwrite().save(str(tmp_path / "pipeline-model"))
    again = PipelineModel.load(str(tmp_path / "pipeline-model"))
    assert_same_params(model, again.stages[0])
    assert again.transform(binary_rows).select(*columns).collect() == expected


@pytest.mark.parametrize("kind", KINDS)
def test_a_binary_model_is_read_by_binary_classification_evaluator(
    fitted, binary_rows, kind
) -> None:
    from pyspark.ml.evaluation import BinaryClassificationEvaluator
    from pyspark.ml.linalg import VectorUDT

    model = fitted[kind][1]
    scored = model.transform(binary_rows)
    added = scored.schema.fields[len(binary_rows.columns) :]
    assert [f.name for f in added] == ["rawPrediction", "probability", "prediction"]
    assert [type(f.dataType) for f in added[:2]] == [VectorUDT, VectorUDT]
    area = BinaryClassificationEvaluator(metricName="areaUnderROC").evaluate(scored)
    assert area > 0.9
    for row in scored.select("rawPrediction", "probability", "prediction").take(20):
        raw = row.rawPrediction.toArray()
        assert len(raw) == 2 and raw.sum() == pytest.approx(0, abs=1e-9)  # centred margins
        softmax = torch.softmax(torch.tensor(raw), dim=0).numpy()
        assert softmax == pytest.approx(row.probability.toArray())
        assert row.prediction == float(np.argmax(raw))
    unwanted = model.copy({model.rawPredictionCol: ""}).transform(binary_rows)
    assert "rawPrediction" not in unwanted.columns and "probability" in unwanted.columns


def test_a_module_instance_trains_and_saving_it_says_what_to_pass(binary_rows, tmp_path) -> None:
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.evaluation import BinaryClassificationEvaluator

    module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    before = {k: v.clone() for k, v in module.state_dict().items()}
    made = ember.spark.EmberEstimator(
        model=module, strategy="bsp", workers=2, epochs=1, batchSize=16, lr=0.1,
        runFields={"out": str(tmp_path / "run")},
    )  # fmt: skip
    assert made.getOrDefault("model") is module
    model = made.fit(binary_rows)
    # the tasks train copies: the estimator's module, and the model's param, are as given
    assert all(torch.equal(v, before[k]) for k, v in module.state_dict().items())
    assert model.getOrDefault("model") is module
    trained = model.torch_model()
    assert trained is not module and isinstance(trained, torch.nn.Sequential)
    assert BinaryClassificationEvaluator().evaluate(model.transform(binary_rows)) > 0.9
    # ML persistence writes params as JSON: the instance is refused naming what to pass
    said = r"model is an instance of Sequential, which Spark ML cannot save.*pass its class"
    stages = made, model, Pipeline(stages=[made]), PipelineModel(stages=[model])
    for number, stage in enumerate(stages):
        with pytest.raises(ConfigError, match=said):
            stage.save(str(tmp_path / f"saved-{number}"))
