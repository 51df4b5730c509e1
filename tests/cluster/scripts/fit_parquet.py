# A user's spark-submit script, top-level code and no __main__ guard, as Spark users write them:
# MNIST from Parquet through ember.spark.fit. Prints the summary's figures as one JSON line.
# Usage: spark-submit --master spark://... fit_parquet.py TRAIN.parquet TEST.parquet OUT
import json
import sys

from pyspark.sql import SparkSession

import ember.spark

spark = SparkSession.builder.appName("fit-parquet").getOrCreate()
train = spark.read.parquet(sys.argv[1])
test = spark.read.parquet(sys.argv[2])
result = ember.spark.fit(
    model="mlp",
    df=train,
    test_df=test,
    strategy="easgd-async",
    workers=2,
    epochs=3,
    out=sys.argv[3],
)
figures = ("test_accuracy", "bytes_pushed", "engine", "wire")
print(json.dumps({key: result.summary.get(key) for key in figures}))
spark.stop()
