# A spark-submit script that trains the digits on the cluster with --device argv[1] and prints
# where each task computed and the GPU address Spark assigned it, as one JSON line.
# Usage: spark-submit --master spark://... [--conf spark.task.resource.gpu.amount=1 ...]
#        fit_devices.py DEVICE OUT
import json
import sys

from pyspark.sql import SparkSession

import ember

spark = SparkSession.builder.appName("fit-devices").getOrCreate()
result = ember.fit(data="digits", engine="spark", strategy="easgd-async", workers=2, epochs=1,
                   device=sys.argv[1], out=sys.argv[2])  # fmt: skip
figures = ("test_accuracy", "device", "devices", "gpu_addresses")
print(json.dumps({key: result.summary.get(key) for key in figures}))
spark.stop()
