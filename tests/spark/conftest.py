"""Spark test fixtures: one local[2] SparkSession for all Spark tests, digits as DataFrames, and
a Spark Connect server on local[2] for the tests of Connect clients."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.connect_server import ConnectServer, free_port
from tests.spark_session import _end_jvm, _servers, no_stray_children, spark

__all__ = ["connect_server", "digits", "no_stray_children", "spark", "to_frame"]

pytest.importorskip("pyspark", reason="the Spark tests need: pip install -e '.[spark]'")


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    """A Spark Connect server on local[2], on a free port of 127.0.0.1; its Python workers run
    this interpreter with this checkout's ember first on their path."""
    log = tmp_path_factory.mktemp("connect") / "server.log"
    server = ConnectServer("local[2]", "127.0.0.1", free_port(), log)
    _servers.append(server)
    yield server
    _end_jvm()


@pytest.fixture(scope="session")
def digits() -> Any:
    from ember.data import load_dataset

    return load_dataset("digits")


@pytest.fixture(scope="session")
def to_frame(spark: Any) -> Any:
    """Arrays as a DataFrame of `features` (array<float>) and `label` rows, via Arrow."""
    import pyarrow as pa

    def make(x: np.ndarray, y: np.ndarray) -> Any:
        flat = x.reshape(len(x), -1)
        features = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), flat.shape[1])
        return spark.createDataFrame(pa.table({"features": features, "label": y}))

    return make
