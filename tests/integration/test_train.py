"""`ember train` end to end: real server and worker processes on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import ember
from ember.checkpoint import load_checkpoint
from ember.metrics import read_metrics
from tests.processes import has_progress, has_worker_records, log_of, wait_for

pytestmark = pytest.mark.timeout(180)
QUICK = ["--data", "digits", "--epochs", "1", "--log-every", "10"]


def ember_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 150
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ember", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def summary_of(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


@pytest.mark.parametrize(
    ("strategy", "servers"),
    [
        ("single", 1),
        ("bsp", 1),
        ("ssp", 1),
        ("async", 1),
        ("easgd", 1),
        ("easgd-async", 1),
        ("allreduce", 1),
        ("diloco", 1),
        ("bsp", 2),
        ("easgd-async", 2),
        ("diloco", 2),
    ],
)
def test_every_strategy_trains_and_writes_the_run_directory(tmp_path, strategy, servers) -> None:
    workers = "1" if strategy == "single" else "2"
    out = tmp_path / "run"
    done = ember_cli(
        "train",
        *QUICK,
        "--epochs",
        "2",
        "--strategy",
        strategy,
        "--workers",
        workers,
        "--servers",
        str(servers),
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    summary = summary_of(out)
    assert summary["strategy"] == strategy and summary["servers"] == (
        servers if strategy not in ("single", "allreduce") else 0
    )
    assert summary["test_accuracy"] > 0.85  # 2 epochs over 10,000 images
    for key in (
        "test_loss",
        "train_seconds",
        "samples_per_second",
        "bytes_pushed",
        "bytes_pulled",
        "exchanges",
        "t_comp_seconds",
        "t_comm_seconds",
        "config",
    ):
        assert key in summary
    if strategy != "single":
        assert summary["bytes_pushed"] > 0 and summary["exchanges"] > 0
    records = read_metrics(out / "metrics.jsonl")
    assert {r["rank"] for r in records if r.get("kind") == "worker"} == set(range(int(workers)))
    assert (out / "checkpoints" / "last").exists()


def test_a_failing_worker_ends_the_run_within_30s_with_its_error_and_no_process_left(
    tmp_path,
) -> None:
    (tmp_path / "faulty.py").write_text(
        "import os, torch\n"
        "class Faulty(torch.nn.Module):\n"
        "    def __init__(self, marker):\n"
        "        super().__init__()\n"
        "        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))\n"
        "        self.calls, self.fails = 0, False\n"
        "        self.marker = marker\n"
        "    def forward(self, x):\n"
        "        self.calls += 1\n"
        "        if self.calls == 30 and self.training:\n"
        "            try:\n"
        "                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))\n"
        "            except FileExistsError:\n"
        "                return self.net(x)\n"
        "            print('about to fail', flush=True)\n"
        "            raise RuntimeError('injected failure in the forward pass')\n"
        "        return self.net(x)\n"
        f"def make():\n    return Faulty({str(tmp_path / 'marker')!r})\n"
    )
    started = time.monotonic()
    done = ember_cli(
        "train",
        *QUICK,
        "--epochs",
        "5",
        "--strategy",
        "bsp",
        "--model",
        "faulty:make",
        "--max-restarts",
        "0",
        "--out",
        str(tmp_path / "run"),
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert done.returncode == 1
    assert time.monotonic() - started < 30
    assert "injected failure in the forward pass" in done.stderr
    assert "about to fail" in done.stderr  # the last lines of that worker's output
    assert "worker " in done.stderr
    leftovers = [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(tmp_path) in " ".join(p.info["cmdline"] or [])
    ]
    assert leftovers == []


def test_killed_launcher_leaves_no_process_and_resume_auto_finishes_the_run(tmp_path) -> None:
    out = tmp_path / "run"
    args = [
        "train",
        "--data",
        "digits",
        "--epochs",
        "6",
        "--strategy",
        "easgd-async",
        "--checkpoint-seconds",
        "0.5",
        "--out",
        str(out),
    ]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "ember", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    assert wait_for(lambda: has_progress(out), 90), "no checkpoint appeared"
    children = psutil.Process(launcher.pid).children(recursive=True)
    assert len(children) >= 3  # one server and two workers
    launcher.send_signal(signal.SIGKILL)
    launcher.wait(10)
    _, alive = psutil.wait_procs(children, timeout=5)
    assert alive == []
    last_saved = (out / "checkpoints" / "last").read_text().strip()

    done = ember_cli("train", *args[1:-2], "--out", str(out), "--resume", "auto")
    assert done.returncode == 0, done.stderr
    summary = summary_of(out)
    assert summary["resumed_from"].endswith(last_saved)
    assert summary["test_accuracy"] > 0.9
    starts = [r for r in read_metrics(out / "metrics.jsonl") if r.get("kind") == "start"]
    assert max(r["first_step"] for r in starts) > 0  # workers continued, not from step 0


def test_interrupted_run_exits_130_and_reaps_every_child(tmp_path) -> None:
    out = tmp_path / "run"
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ember",
            "train",
            "--data",
            "digits",
            "--epochs",
            "20",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as in a terminal: a shell that started the tests in the background made them ignore
        # SIGINT, and that would be inherited
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert wait_for(lambda: has_worker_records(out), 60), "no worker reported progress"
    children = psutil.Process(launcher.pid).children(recursive=True)
    launcher.send_signal(signal.SIGINT)
    _, err = launcher.communicate(timeout=30)
    assert launcher.returncode == 130, err
    assert "interrupted" in err
    _, alive = psutil.wait_procs(children, timeout=5)
    assert alive == []


def test_existing_run_directory_is_never_overwritten_without_resume(tmp_path) -> None:
    out = tmp_path / "run"
    assert (
        ember_cli(
            "train", *QUICK, "--strategy", "single", "--workers", "1", "--out", str(out)
        ).returncode
        == 0
    )
    before = (out / "summary.json").read_text()
    again = ember_cli("train", *QUICK, "--strategy", "single", "--workers", "1", "--out", str(out))
    assert again.returncode == 2
    assert "already holds checkpoints; pass --resume auto" in again.stderr
    assert (out / "summary.json").read_text() == before


@pytest.mark.parametrize(
    ("strategy", "workers", "every"), [("easgd", "2", "10"), ("single", "1", "40")]
)
def test_corrupt_newest_checkpoint_is_named_and_resume_auto_falls_back(
    tmp_path, strategy, workers, every
) -> None:
    out = tmp_path / "run"
    run = [*QUICK, "--epochs", "3", "--strategy", strategy, "--workers", workers]
    done = ember_cli("train", *run, "--checkpoint-steps", every, "--out", str(out))
    assert done.returncode == 0, done.stderr
    steps = sorted((out / "checkpoints").glob("step-*"))
    assert len(steps) >= 2
    state = steps[-1] / "state.safetensors"
    state.write_bytes(state.read_bytes()[:-100])
    bad = ember_cli("evaluate", "--checkpoint", str(steps[-1]))
    assert bad.returncode == 2
    assert f"{state}: sha256 mismatch" in bad.stderr
    good = ember_cli("evaluate", "--checkpoint", str(steps[-2]))
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["test_accuracy"] > 0.8
    resumed = ember_cli("train", *run, "--out", str(out), "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr
    assert summary_of(out)["resumed_from"] == str(steps[-2])
    assert state.parent.exists()  # the corrupt one is left for inspection, not overwritten


def test_resume_auto_keeps_the_runs_settings_and_refuses_another_strategy(tmp_path) -> None:
    out = tmp_path / "run"
    first = ["--strategy", "bsp", "--data", "digits", "--lr", "0.02", "--workers", "2"]
    done = ember_cli("train", *first, "--epochs", "1", "--log-every", "10", "--out", str(out))
    assert done.returncode == 0, done.stderr
    resumed = ember_cli("train", "--out", str(out), "--resume", "auto", "--epochs", "2")
    assert resumed.returncode == 0, resumed.stderr
    summary = summary_of(out)
    assert f"ember: resuming from {summary['resumed_from']}: epochs 1 -> 2\n" in resumed.stderr
    saved = summary["config"]
    assert (saved["strategy"], saved["data"], saved["lr"], saved["epochs"]) == (
        "bsp",
        "digits",
        0.02,
        2,
    )
    last = out / "checkpoints" / (out / "checkpoints" / "last").read_text().strip()
    refused = ember_cli("train", "--out", str(out), "--resume", "auto", "--strategy", "async")
    assert refused.returncode == 2
    assert refused.stderr == (
        f"ember: error: resume: strategy was 'bsp' in {last}, got 'async'; drop --strategy or"
        " start a new --out\n"
    )


def test_fit_api_returns_the_summary_and_model_and_writes_tensorboard_events(tmp_path) -> None:
    import torch

    result = ember.fit(
        data="digits",
        model="logreg",
        strategy="easgd",
        workers=2,
        epochs=1,
        out=str(tmp_path / "run"),
        tensorboard=True,
        eval_every=20,
    )
    assert isinstance(result.model, torch.nn.Module)
    assert result.summary["test_accuracy"] > 0.8
    assert summary_of(tmp_path / "run")["test_accuracy"] == result.summary["test_accuracy"]
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    evals = [r for r in map(json.loads, lines) if r["kind"] == "eval"]
    steps_per_epoch = result.summary["samples"] // 2 // 64
    assert [e["step"] for e in evals] == [20, 40, 60, steps_per_epoch][: len(evals)]
    assert len(evals) == 1 + (steps_per_epoch - 1) // 20
    assert all(e["samples"] == e["step"] * 64 * 2 for e in evals)
    seconds = [e["seconds"] for e in evals]
    assert seconds == sorted(seconds) and 0 < seconds[-1] <= result.summary["train_seconds"]


def test_synthetic_logistic_regression_matches_a_single_process_fit(tmp_path) -> None:
    common = {
        "data": "synthetic-lr",
        "model": "logreg",
        "synthetic_samples": 40_000,
        "epochs": 3,
        "lr": 0.01,
    }
    single = ember.fit(strategy="single", workers=1, out=str(tmp_path / "single"), **common)
    spread = ember.fit(strategy="easgd-async", workers=2, out=str(tmp_path / "easgd"), **common)
    assert single.summary["test_accuracy"] > 0.8
    assert abs(spread.summary["test_accuracy"] - single.summary["test_accuracy"]) <= 0.01


def test_a_worker_killed_mid_run_ends_the_run_naming_it_and_no_process_is_left(tmp_path) -> None:
    out = tmp_path / "run"
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ember",
            "train",
            "--data",
            "digits",
            "--epochs",
            "30",
            "--strategy",
            "bsp",
            "--max-restarts",
            "0",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert wait_for(lambda: has_worker_records(out), 60), "no worker reported progress"
    children = psutil.Process(launcher.pid).children(recursive=True)
    victim = next(p for p in children if "worker-1" in log_of(p))
    killed_at = time.monotonic()
    victim.kill()
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 1
    assert time.monotonic() - killed_at < 30
    assert "worker 1 exited with code -9" in err
    _, alive = psutil.wait_procs(children, timeout=5)
    assert alive == []


def test_diloco_trains_the_mnist_mlp_to_96_percent_in_3_epochs_at_its_default_tau(
    tmp_path,
) -> None:
    out = tmp_path / "run"
    result = ember.fit(
        data="mnist", model="mlp", strategy="diloco", workers=2, epochs=3, out=str(out)
    )
    summary = result.summary
    assert summary["config"]["tau"] == 200
    assert summary["test_accuracy"] >= 0.96
    # 468 steps an epoch per worker: 7 rounds in 1,404 steps, and each worker's final push
    assert summary["exchanges"] == 2 * (7 + 1)
    saved = load_checkpoint(out / "checkpoints")
    assert saved.tensors["momentum"].any()  # the outer momentum is checkpointed


def test_streaming_diloco_in_two_fragments_trains_the_mnist_mlp_to_96_percent(tmp_path) -> None:
    result = ember.fit(
        data="mnist", strategy="diloco", fragments=2, servers=2, workers=2, epochs=3,
        out=str(tmp_path / "run"),
    )  # fmt: skip
    assert result.summary["test_accuracy"] >= 0.96
    # a fragment syncs every 100 steps, alternately, 14 times in 1,404 steps; then each
    # fragment's last partial period: 16 exchanges a worker
    assert result.summary["exchanges"] == 2 * 16
