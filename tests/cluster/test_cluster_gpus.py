"""GPU scheduling on the Spark standalone cluster: each worker host offers one GPU at an address
of its own (scripts/fake_gpus.sh reports GPUs that are not there), and each training task takes
the address Spark assigned it, without touching CUDA where there is none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ember.config.devices import cuda_count
from ember_lab.emulated.netns import spark_class
from tests.cluster.runs import RUN_TIMEOUT, train

pytestmark = pytest.mark.timeout(900)
SCRIPTS = Path(__file__).parent / "scripts"
ASK_FOR_GPUS = ["--conf", "spark.executor.resource.gpu.amount=1",
                "--conf", "spark.task.resource.gpu.amount=1"]  # fmt: skip


def test_each_task_records_the_gpu_address_spark_assigned_it(cluster, spark_env, tmp_path):
    if cuda_count():
        pytest.skip("the fake addresses would be taken for this machine's real GPUs")
    submit = str(Path(spark_class()).with_name("spark-submit"))
    script = [submit, "--master", cluster.master_url, *ASK_FOR_GPUS,
              str(SCRIPTS / "fit_devices.py"), "auto", str(tmp_path / "run")]  # fmt: skip
    done = cluster.run(0, script, env=spark_env, timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # host 1's worker offers GPU "5", host 2's "6": one task on each, each with its own
    assert sorted(result["gpu_addresses"].values()) == ["5", "6"], result
    assert set(result["gpu_addresses"]) == {"0", "1"}
    # auto without CUDA computes on the CPU, and says so for each task
    assert result["device"] == "auto" and result["devices"] == {"0": "cpu", "1": "cpu"}
    assert result["test_accuracy"] > 0.5


def test_device_cuda_on_tasks_spark_gave_no_gpu_is_one_error_saying_how(
    cluster, spark_env, tmp_path
) -> None:
    out = tmp_path / "run"
    done = train(cluster, spark_env, out, "--data", "digits", "--epochs", "1", "--device", "cuda")
    assert done.returncode != 0
    assert (
        "device 'cuda': Spark assigned this task no GPU; have the cluster schedule one per task"
        " (spark.task.resource.gpu.amount=1" in done.stderr
    ), done.stderr[-4000:]
    assert not (out / "summary.json").exists()
