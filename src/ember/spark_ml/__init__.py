"""ember in Spark ML pipelines: an Estimator that trains as `ember.spark.fit` does and the Model
it returns, which scores DataFrames on the executors. Imports pyspark: reach it through
`ember.spark.EmberEstimator`, which loads it when first used.

Map:
- EmberEstimator -> estimator.py: `fit(df)` trains a run and returns an EmberModel
- EmberModel -> model.py: `transform(df)` adds prediction and probability columns; ML
  persistence (save/load, inside a PipelineModel too) as metadata plus model.safetensors
- EmberParams -> params.py: the Params both share (Spark's column names, the run's fields)
- scorer -> scoring.py: the executors' side of transform (torch on Arrow batches)

imports: config, data, errors, export, spark
"""

from __future__ import annotations

from ember.spark_ml.estimator import EmberEstimator
from ember.spark_ml.model import EmberModel
from ember.spark_ml.params import EmberParams

__all__ = ["EmberEstimator", "EmberModel", "EmberParams"]
