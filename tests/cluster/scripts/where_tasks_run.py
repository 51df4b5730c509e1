"""A plain PySpark job: a barrier stage of N tasks, each reporting the address it reaches host 0
from (its own host's). Prints one JSON line: the driver's address and the tasks' addresses.

Usage: python where_tasks_run.py MASTER_URL TASKS"""

import json
import socket
import sys

from pyspark import BarrierTaskContext
from pyspark.sql import SparkSession

master, tasks = sys.argv[1], int(sys.argv[2])
spark = (
    SparkSession.builder.master(master)
    .appName("where-tasks-run")
    .config("spark.executor.memory", "1g")
    .config("spark.ui.showConsoleProgress", "false")
    .getOrCreate()
)


def where(_: object) -> list[str]:
    BarrierTaskContext.get().barrier()  # every task at once: one per worker host
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.connect(("198.18.0.10", 9))  # UDP: nothing is sent, only a route and a source chosen
    return [probe.getsockname()[0]]


found = spark.sparkContext.parallelize(range(tasks), tasks).barrier().mapPartitions(where).collect()
driver = spark.sparkContext.getConf().get("spark.driver.host")
print(json.dumps({"driver": driver, "tasks": sorted(found)}))
spark.stop()
