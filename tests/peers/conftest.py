"""The peers' scenarios that need Spark share the Spark suite's one local[2] session, and its
check that only Spark's own processes (the JVM and its Python workers) outlive a test."""

from tests.spark_session import no_stray_children, spark

__all__ = ["no_stray_children", "spark"]
