"""The Spark engine: one barrier task per worker, parameter servers beside the driver.

Map:
- train_spark, train_dataframe -> driver.py: a run on Spark, from the driver's side
- train_partition -> task.py: a training task's body (importable without the driver)
- RecordCollector, RecordSender -> records.py: tasks' records streamed to the driver live
- Ready, StoreAddress -> gather.py: what the tasks tell each other through allGather
- Job, start_warm_up -> jobs.py: the Spark jobs of a run (Python workers warmed up; training)
- session, check_cluster, end_spark -> session.py: the SparkSession a run trains in
- TaggedJobs, is_connect -> connect.py: a Spark Connect session's master, slots and jobs
- local_driver_options, class_archive -> jvm.py: Java options (class-data archive) of a local
  session's JVM
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ember.engines.spark.driver import train_dataframe, train_spark


def __getattr__(name: str) -> Any:
    # the driver only when asked for: a task imports this package for task.py alone
    if name in ("train_spark", "train_dataframe"):
        from ember.engines.spark import driver

        return getattr(driver, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["train_dataframe", "train_spark"]
