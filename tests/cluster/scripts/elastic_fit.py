# A Spark application with dynamic allocation (and shuffle tracking, as standalone needs), as
# a user of a shared cluster runs one: MNIST, async, a worker range of 1 to 4 members, each an
# ordinary task on the executors that come and go. Prints the summary as one JSON line.
# Usage: python elastic_fit.py MASTER OUT EPOCHS
import json
import sys

from pyspark.sql import SparkSession

import ember

master, out, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
spark = (
    SparkSession.builder.master(master)
    .appName("elastic-fit")
    .config("spark.dynamicAllocation.enabled", "true")
    .config("spark.dynamicAllocation.shuffleTracking.enabled", "true")
    .config("spark.dynamicAllocation.minExecutors", "1")
    .config("spark.dynamicAllocation.maxExecutors", "4")
    .config("spark.dynamicAllocation.executorIdleTimeout", "5s")
    .config("spark.dynamicAllocation.schedulerBacklogTimeout", "1s")
    .config("spark.executor.cores", "1")
    .config("spark.executor.memory", "1g")
    .config("spark.task.maxFailures", "8")
    .getOrCreate()
)
result = ember.fit(
    data="mnist",
    model="mlp",
    strategy="async",
    lr=0.02,  # 4 members at once from the first step: a rate their staleness takes
    workers=(1, 4),
    epochs=epochs,
    engine="spark",
    log_every=20,
    worker_timeout=10,  # a lost member is dropped, and its rows dealt again, after this
    out=out,
)
print(json.dumps(result.summary))
spark.stop()
