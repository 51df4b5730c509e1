"""ember through Spark Connect: a client process with no SparkContext trains with
ember.spark.fit and an EmberEstimator pipeline on a Connect server's local[2], saves and loads
the fitted pipeline, and scores with transform."""

from __future__ import annotations

import pytest

from ember.metrics import read_metrics
from tests.connect_server import run_client
from tests.spark.test_spark_training import FAULTY

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


def test_a_named_dataset_trains_in_the_active_connect_session(connect_server, tmp_path) -> None:
    result = run_client(connect_server.url, "data", tmp_path / "run", CLIENT_TIMEOUT)
    assert result["engine"] == "spark" and result["test_accuracy"] >= 0.85  # one epoch
    assert result["spark"]["master"] == "local[2]" and result["spark"]["session_seconds"] == 0


def test_an_estimator_pipeline_fits_saves_loads_and_transforms_through_a_connect_session(
    connect_server, tmp_path
) -> None:
    result = run_client(connect_server.url, "pipeline", tmp_path / "run", CLIENT_TIMEOUT)
    assert result["test_accuracy"] >= ACCURACY
    # the loaded pipeline scored the 2,000 test rows on the server's executors, as the run did
    assert result["scored_rows"] == 2000
    assert {"prediction", "probability", "scaled"} <= set(result["columns"])
    assert abs(result["scored_accuracy"] - result["test_accuracy"]) <= 1 / 2000
    assert (tmp_path / "run-saved" / "stages").is_dir()


def test_a_stage_retried_under_connect_is_counted_and_resumes_from_the_servers(
    connect_server, tmp_path
) -> None:
    module = tmp_path / "ember_fails_once_connect.py"
    module.write_text(f"MARKER = {str(tmp_path / 'failed')!r}\nHOW = 'raise'\n{FAULTY}")
    out = tmp_path / "run"
    result = run_client(connect_server.url, "retry", out, CLIENT_TIMEOUT, None, None, str(module))
    assert (tmp_path / "failed").exists()  # the failure did happen
    assert result["test_accuracy"] > 0.85
    assert result["spark"]["stage_attempts"] >= 2  # counted on the tasks' incarnations
    records = read_metrics(out / "metrics.jsonl")
    assert any(r.get("event") == "stage retry" for r in records)
    starts = [r for r in records if r.get("kind") == "start"]
    assert {r["rank"] for r in starts} == {0, 1} and all(r["attempt"] >= 1 for r in starts)
    assert max(r["first_step"] for r in starts) > 0  # continued from the pushed steps
