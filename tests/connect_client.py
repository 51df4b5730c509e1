# A Spark Connect client, as a user's script: MNIST's first 10,000 training and 2,000 test
# images (ember's `digits`) handed to the server as Arrow, then one of
#   fit       ember.spark.fit
#   retry     the same with the factory `make` of MODULE, shipped as a Connect artifact
#   data      ember.spark.fit(data="digits"): ember hands the data to the session itself
#   estimator EmberEstimator.fit, then transform scored with Spark's evaluator
#   pipeline  the same behind a StandardScaler that centers the pixels, the fitted
#             PipelineModel saved and loaded before it scores
# Prints its figures as one JSON line.
# Usage: python connect_client.py sc://HOST:PORT fit|retry|data|estimator|pipeline OUT [MODULE]
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.evaluation import MulticlassClassificationEvaluator
from pyspark.ml.feature import StandardScaler
from pyspark.ml.functions import array_to_vector
from pyspark.sql import SparkSession

import ember.spark
from ember.data import load_dataset

url, what, out = sys.argv[1:4]
spark = SparkSession.builder.remote(url).getOrCreate()
digits = load_dataset("digits")


def frame(x, y, is_test):
    flat = x.reshape(len(x), -1)
    features = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), flat.shape[1])
    flag = pa.array(np.full(len(x), is_test))
    return spark.createDataFrame(pa.table({"features": features, "label": y, "is_test": flag}))


train = frame(digits.x_train, digits.y_train, False)
test = frame(digits.x_test, digits.y_test, True)
fields = {"strategy": "easgd-async", "workers": 2, "epochs": 3}
if what == "data":
    result = ember.spark.fit(data="digits", model="mlp", out=out, **{**fields, "epochs": 1})
    figures = {key: result.summary[key] for key in ("test_accuracy", "spark", "engine")}
elif what in ("fit", "retry"):
    model = "mlp"
    if what == "retry":
        module = Path(sys.argv[4])
        sys.path.insert(0, str(module.parent))  # the client builds the model too
        spark.addArtifacts(str(module), pyfile=True)
        model, fields = f"{module.stem}:make", {**fields, "epochs": 2, "tau": 4}
    result = ember.spark.fit(model=model, df=train, test_df=test, out=out, **fields)
    figures = {key: result.summary[key] for key in ("test_accuracy", "spark", "wire", "engine")}
else:  # estimator, or pipeline: a Spark ML stage before it, the fitted pipeline saved, loaded
    estimator = ember.spark.EmberEstimator(
        model="mlp", validationIndicatorCol="is_test", runFields={"out": out}, **fields
    )
    if what == "pipeline":
        vectors = lambda frame: frame.withColumn("vector", array_to_vector("features"))  # noqa: E731
        scaler = StandardScaler(inputCol="vector", outputCol="scaled", withMean=True, withStd=False)
        fitted = Pipeline(stages=[scaler, estimator.setParams(featuresCol="scaled")])
        fitted = fitted.fit(vectors(train.unionByName(test)))
        fitted.write().overwrite().save(f"{out}-saved")
        model = fitted.stages[-1]
        scored = PipelineModel.load(f"{out}-saved").transform(vectors(test))
    else:
        model = estimator.fit(train.unionByName(test))
        scored = model.transform(test)
    evaluator = MulticlassClassificationEvaluator(metricName="accuracy")
    figures = {
        "test_accuracy": model.summary["test_accuracy"],
        "spark": model.summary["spark"],
        "wire": model.summary["wire"],
        "scored_accuracy": evaluator.evaluate(scored),
        "scored_rows": scored.count(),
        "columns": scored.columns,
    }
print(json.dumps(figures))
spark.stop()
