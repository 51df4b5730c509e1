"""Which device each worker takes: --device's syntax, the local engine's GPU i mod count, a
Spark task's assigned GPU, and that CUDA is never asked about where the CPU was asked for."""

from __future__ import annotations

import pytest

import ember.worker.device as devicework
from ember.config import RunConfig
from ember.config.devices import (
    Placement,
    check_device,
    needs_count,
    place_local,
    place_task,
    stages,
)
from ember.errors import ConfigError
from ember.metrics import summarize_workers


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:12"])
def test_device_takes_auto_cpu_cuda_and_cuda_with_an_index(device) -> None:
    check_device(device)


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:x", "CUDA", "mps", "cuda:-1"])
def test_any_other_device_is_named_in_the_error(device) -> None:
    with pytest.raises(ConfigError) as caught:
        check_device(device)
    assert str(caught.value) == f"device must be one of auto, cpu, cuda, cuda:N; got {device!r}"


def test_local_workers_take_gpu_rank_mod_count_and_share_when_there_are_more() -> None:
    placed = [place_local("auto", rank, 3, 2) for rank in range(3)]
    assert [p.device for p in placed] == ["cuda:0", "cuda:1", "cuda:0"]
    assert not any(p.exclusive for p in placed)
    assert [place_local("cuda", r, 2, 2) for r in range(2)] == [
        Placement("cuda:0"),
        Placement("cuda:1"),
    ]
    assert place_local("cuda:1", 0, 2, 2) == Placement("cuda:1", exclusive=False)


def test_local_auto_without_a_gpu_and_cpu_are_the_cpu() -> None:
    assert place_local("auto", 1, 4, 0) == Placement("cpu")
    assert place_local("cpu", 1, 4, 8) == Placement("cpu")


def test_local_cuda_without_a_gpu_or_past_the_last_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"^device 'cuda' needs CUDA, and torch sees no CUDA"):
        place_local("cuda", 0, 1, 0)
    with pytest.raises(ConfigError) as caught:
        place_local("cuda:2", 0, 1, 2)
    assert (
        str(caught.value) == "device 'cuda:2': this machine has 2 CUDA device(s), numbered 0 to 1"
    )


def test_a_spark_task_takes_the_gpu_address_it_was_assigned() -> None:
    assert place_task("auto", ["3"], 4) == Placement("cuda:3", "3")
    assert place_task("cuda", ["1", "2"], 4) == Placement("cuda:1", "1")


def test_a_spark_task_on_the_cpu_still_records_its_assigned_gpu() -> None:
    assert place_task("cpu", ["3"], 4) == Placement("cpu", "3")
    assert place_task("auto", ["3"], 0) == Placement("cpu", "3")  # no CUDA in the executor
    assert place_task("auto", [], 4) == Placement("cpu")  # no GPU scheduled: none piled onto


def test_cuda_on_a_spark_task_without_a_gpu_says_how_to_schedule_one() -> None:
    with pytest.raises(ConfigError) as caught:
        place_task("cuda", [], 4)
    assert str(caught.value) == (
        "device 'cuda': Spark assigned this task no GPU; have the cluster schedule one per task"
        " (spark.task.resource.gpu.amount=1 and spark.executor.resource.gpu.amount with a"
        " discovery script), or use --device auto"
    )
    with pytest.raises(ConfigError, match="assigned this task GPU 3, but torch sees no CUDA"):
        place_task("cuda", ["3"], 0)
    with pytest.raises(ConfigError, match="GPU address 'gpu-a', which is not one of the CUDA"):
        place_task("auto", ["gpu-a"], 2)


def test_cpu_and_auto_on_a_task_without_a_gpu_never_ask_for_cuda(monkeypatch) -> None:
    assert not needs_count("cpu") and not needs_count("cpu", ["1"])
    assert not needs_count("auto", [])
    assert needs_count("auto") and needs_count("auto", ["0"]) and needs_count("cuda", [])

    def no_cuda() -> int:
        raise AssertionError("CUDA was asked about")

    monkeypatch.setattr(devicework, "cuda_count", no_cuda)
    assert devicework.placement("cpu", 0, 2, None) == Placement("cpu")
    assert devicework.placement("cpu", 1, 2, ("5",)) == Placement("cpu", "5")
    assert devicework.placement(RunConfig().device, 0, 2, ()) == Placement("cpu")


def test_cuda_on_a_local_run_without_cuda_fails_validation(monkeypatch) -> None:
    monkeypatch.setattr("ember.config.run.cuda_count", lambda: 0)
    with pytest.raises(ConfigError, match=r"^device 'cuda:0' needs CUDA"):
        RunConfig(device="cuda:0").validate()
    RunConfig(device="cuda", engine="spark").validate()  # a Spark task checks its own
    RunConfig(device="auto").validate()


def test_the_cpu_stages_only_when_told_to(monkeypatch) -> None:
    monkeypatch.delenv("EMBER_HOST_STAGING", raising=False)
    assert not stages("cpu") and stages("cuda:0")
    monkeypatch.setenv("EMBER_HOST_STAGING", "1")
    assert stages("cpu")


def test_the_summary_names_each_workers_device_and_the_gpus_workers_shared() -> None:
    done = [
        {"rank": 0, "device": "cuda:0", "gpu": None},
        {"rank": 1, "device": "cuda:1", "gpu": None},
        {"rank": 2, "device": "cuda:0", "gpu": None},
    ]
    figures = summarize_workers(done, 1.0)
    assert figures["devices"] == {"0": "cuda:0", "1": "cuda:1", "2": "cuda:0"}
    assert figures["gpus_shared"] == {"cuda:0": [0, 2]}
    assert "gpu_addresses" not in figures
    tasks = [{"rank": 0, "device": "cpu", "gpu": "5"}, {"rank": 1, "device": "cpu", "gpu": "6"}]
    figures = summarize_workers(tasks, 1.0)
    assert figures["gpu_addresses"] == {"0": "5", "1": "6"} and "gpus_shared" not in figures
