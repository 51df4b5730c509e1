"""torchrun's variables for a torch.distributed loop under ember.run: what each engine's worker
is told, and the environment left as it was found."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ember.config import RunConfig
from ember.config.devices import Placement
from ember.errors import ConfigError
from ember.worker.spec import WorkerSpec
from ember.worker.torchrun import ScriptFile, torchrun_environment, torchrun_variables


def _spec(rank: int, gpus: tuple[str, ...] | None = None, store: object = None) -> WorkerSpec:
    config = RunConfig(strategy="allreduce", workers=3)
    return WorkerSpec(config, rank, 3, rendezvous="tcp://10.0.0.7:29500", gpus=gpus, store=store)


def test_a_local_worker_is_a_process_of_one_node() -> None:
    told = torchrun_variables(_spec(2), Placement("cpu"))
    assert told == {
        "RANK": "2",
        "WORLD_SIZE": "3",
        "LOCAL_RANK": "2",
        "LOCAL_WORLD_SIZE": "3",
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
        "MASTER_ADDR": "10.0.0.7",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RESTART_COUNT": "0",
    }


def test_a_spark_task_is_a_node_that_joins_rank_0s_store_as_a_client() -> None:
    told = torchrun_variables(_spec(1, gpus=(), store=object()), Placement("cpu"))
    assert (told["RANK"], told["LOCAL_RANK"], told["LOCAL_WORLD_SIZE"]) == ("1", "0", "1")
    assert (told["GROUP_RANK"], told["GROUP_WORLD_SIZE"]) == ("1", "3")
    # the store is open already: torch's env:// then connects every rank as a client
    assert told["TORCHELASTIC_USE_AGENT_STORE"] == "True"


def test_local_rank_is_the_gpu_ember_placed_the_worker_on() -> None:
    told = torchrun_variables(_spec(1, gpus=("3",)), Placement("cuda:3", gpu="3"))
    assert told["LOCAL_RANK"] == "3"


def test_the_variables_are_set_inside_the_block_and_restored_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MASTER_PORT", "1234")
    monkeypatch.delenv("RANK", raising=False)
    with torchrun_environment(_spec(2), Placement("cpu")):
        assert (os.environ["RANK"], os.environ["MASTER_PORT"]) == ("2", "29500")
    assert os.environ["MASTER_PORT"] == "1234" and "RANK" not in os.environ


def test_under_a_strategy_with_servers_init_process_group_is_refused_in_embers_words() -> None:
    import torch.distributed as dist

    spec = WorkerSpec(RunConfig(strategy="easgd-async", workers=2), 0, 2)
    refused = pytest.raises(ConfigError, match="strategy 'easgd-async' trains through the param")
    with refused, torchrun_environment(spec, Placement("cpu")):
        assert "RANK" not in os.environ
        dist.init_process_group("gloo")
    passed = pytest.raises(ValueError, match="another error")  # anything else goes through
    with passed, torchrun_environment(spec, Placement("cpu")):
        raise ValueError("another error")


def test_a_script_runs_as_main_with_its_arguments(tmp_path: Path) -> None:
    script, out = tmp_path / "train.py", tmp_path / "said.txt"
    script.write_text(
        "import sys\n"
        "if __name__ == '__main__':\n"
        f"    open({str(out)!r}, 'w').write(' '.join(sys.argv[1:]))\n"
        "    sys.exit(0)\n"
    )
    ScriptFile.read(script)("--lr", 0.01)
    assert out.read_text() == "--lr 0.01"


def test_a_script_copied_to_a_host_without_it_runs_there(tmp_path: Path) -> None:
    out = tmp_path / "said.txt"
    ScriptFile("/nowhere/train.py", f"open({str(out)!r}, 'w').write(__file__)\n")()
    ran = out.read_text()
    assert ran.endswith("/train.py") and not ran.startswith("/nowhere")


def test_a_script_that_exits_with_a_status_is_an_error_naming_it(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text("raise SystemExit(3)\n")
    with pytest.raises(RuntimeError, match=r"fails.py exited with status 3"):
        ScriptFile.read(script)()


def test_what_is_not_a_python_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a Python file; pass a training function"):
        ScriptFile.read(tmp_path / "missing.py")
