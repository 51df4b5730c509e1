"""EmberEstimator: `ember.spark.fit` as a Spark ML Estimator, for Pipelines and tuning."""

from __future__ import annotations

import threading
from typing import Any

from pyspark.ml import Estimator
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsWritable, MLWriter

from ember.errors import ConfigError
from ember.spark import fit
from ember.spark_ml.model import EmberModel
from ember.spark_ml.params import EmberParams

_ONE_FIT_AT_A_TIME = threading.Lock()  # in this driver process: see _fit


class EmberEstimator(
    Estimator[EmberModel],
    EmberParams,
    DefaultParamsReadable["EmberEstimator"],
    DefaultParamsWritable,
):
    """Trains as `ember.spark.fit` does (one Spark barrier task per worker, parameter servers
    beside the driver) and returns an EmberModel.

    Params: featuresCol, labelCol, predictionCol, probabilityCol, rawPredictionCol,
    validationIndicatorCol, model (the factory, or an nn.Module, which trains but cannot be
    saved), loss, strategy, workers, epochs, lr, tau, batchSize, mlflow (log each
    fit to an MLflow run; unset: when one is active), and runFields for any
    other field of ember.spark.fit: `EmberEstimator(model="mlp", workers=2, tau=4,
    runFields={"servers": 2})`. Each fit writes a run directory as ember.spark.fit does
    (runFields' `out`, else runs/<timestamp>-<strategy>-<pid>)."""

    def __init__(self, **params: Any) -> None:
        super().__init__()
        self.set_params(params)

    def setParams(self, **params: Any) -> EmberEstimator:
        self.set_params(params)
        return self

    def _fit(self, dataset: Any) -> EmberModel:
        # CrossValidator's and TrainValidationSplit's parallelism fits from several driver
        # threads at once: each fit's barrier stage wants a slot per worker, and at once they
        # would name the same runs/<second>-<strategy>-<pid> directory. One at a time, tuning
        # finishes as with parallelism=1 (its evaluations still run side by side).
        with _ONE_FIT_AT_A_TIME:
            return self._fit_alone(dataset)

    def _fit_alone(self, dataset: Any) -> EmberModel:
        from pyspark.sql import functions as F
        from pyspark.sql.types import BooleanType

        train, test = dataset, None  # no indicator: ember.spark.fit holds out a seeded tenth
        if self.isDefined(self.validationIndicatorCol):
            indicator = self.getValidationIndicatorCol()
            types = {f.name: f.dataType for f in dataset.schema.fields}
            if not isinstance(types.get(indicator), BooleanType):
                got = types[indicator].simpleString() if indicator in types else "no such column"
                raise ConfigError(
                    f"validationIndicatorCol {indicator!r} must be a boolean column, got {got}"
                )
            marked = F.coalesce(F.col(indicator), F.lit(False))
            train, test = dataset.filter(~marked), dataset.filter(marked)
        result = fit(
            model=self.getOrDefault(self.model),
            df=train,
            features_col=self.getFeaturesCol(),
            label_col=self.getLabelCol(),
            test_df=test,
            weight_col=self.getWeightCol() if self.isDefined(self.weightCol) else None,
            mlflow=self.getOrDefault(self.mlflow) if self.isDefined(self.mlflow) else None,
            **self.run_fields(),
        )
        model = EmberModel.from_files(result.run_dir, self.model_source(), result.summary)
        model._resetUid(self.uid)  # as Spark's own estimators' models take their uid
        return self._copyValues(model)

    def write(self) -> MLWriter:
        self.check_persistable()
        return super().write()
