"""ember through Spark Connect: a client process with no SparkContext trains with
ember.spark.fit and EmberEstimator on a Connect server's local[2], and scores with transform."""

from __future__ import annotations

import pytest

from tests.connect_server import run_client

pytestmark = pytest.mark.timeout(420)  # the server's first jobs, then a run, on shared cores
CLIENT_TIMEOUT = 360.0
ACCURACY = 0.9  # mlp, 3 epochs of easgd-async on 10,000 MNIST images, scored on 2,000


def test_ember_spark_fit_trains_through_a_connect_session(connect_server, tmp_path) -> None:
    result = run_client(connect_server.url, "fit", tmp_path / "run", CLIENT_TIMEOUT)
    assert result["engine"] == "spark" and result["test_accuracy"] >= ACCURACY
    spark = result["spark"]
    assert spark["master"] == "local[2]" and spark["stage_attempts"] == 1
    # the servers beside the client, on loopback as for any local master
    assert spark["advertise_address"] == "127.0.0.1"
    assert result["wire"]["encrypted"] is True
    assert (tmp_path / "run" / "summary.json").is_file()


def test_the_estimator_fits_and_transforms_through_a_connect_session(
    connect_server, tmp_path
) -> None:
    result = run_client(connect_server.url, "estimator", tmp_path / "run", CLIENT_TIMEOUT)
    assert result["test_accuracy"] >= ACCURACY
    # transform scored the 2,000 test rows on the server's executors, as the run scored them
    assert result["scored_rows"] == 2000
    assert {"prediction", "probability"} <= set(result["columns"])
    assert abs(result["scored_accuracy"] - result["test_accuracy"]) <= 1 / 2000
