"""`ember train` on the emulated cluster: the driver in host 0, tasks on the worker hosts."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from ember_lab.emulated.netns import Cluster, namespace
from tests.processes import has_progress, wait_for

RUN_TIMEOUT = 600.0  # seconds one training run may take on two shared cores
# for runs that something happens to mid-training: checkpoints often, so progress shows early
WATCHED = ("--checkpoint-steps", "20")


def train_argv(cluster: Cluster, out: Path, *flags: str) -> list[str]:
    """MNIST on the cluster's master, two workers (barrier tasks on hosts 1 and 2)."""
    return [sys.executable, "-m", "ember", "train", "--engine", "spark",
            "--master", cluster.master_url, "--data", "mnist", "--workers", "2",
            "--out", str(out), *flags]  # fmt: skip


def train(
    cluster: Cluster, env: dict[str, str], out: Path, *flags: str, timeout: float = RUN_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    return cluster.run(0, train_argv(cluster, out, *flags), env=env, timeout=timeout)


def start_training(
    cluster: Cluster, env: dict[str, str], out: Path, *flags: str
) -> subprocess.Popen[Any]:
    """A run in the background (checkpointing often, see wait_for_steps); its output goes to
    out.log."""
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.with_suffix(".log")
    return cluster.popen(0, train_argv(cluster, out, *WATCHED, *flags), env=env, log=log)


def summary(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return data


def wait_for_steps(out: Path, process: subprocess.Popen[Any], seconds: float = 300.0) -> None:
    """Until the run shows that workers are taking steps (bounded): a progress record in
    metrics.jsonl, or a checkpoint of workers past step 0 (runs started with TRAINING flags
    checkpoint every few server steps, which does not depend on the records' stream)."""

    def progressed() -> bool:
        metrics = out / "metrics.jsonl"
        if process.poll() is not None:
            return True
        if metrics.exists() and '"kind": "worker"' in metrics.read_text():
            return True
        try:
            return has_progress(out)
        except (OSError, ValueError, KeyError):  # a checkpoint being replaced right now
            return False

    assert wait_for(progressed, seconds), f"no worker progress in {seconds:g}s; see {out}"
    assert process.poll() is None, f"the run ended before training was seen: {out}.log"


def initial_parameters(seed: int = 0) -> np.ndarray:
    """The flat vector the servers start from for mlp on mnist (built as the launcher does)."""
    from ember.algorithms import flatten_parameters
    from ember.config import RunConfig
    from ember.worker.loop import make_model
    from ember.worker.spec import load_data

    config = RunConfig(data="mnist", model="mlp", seed=seed)
    return flatten_parameters(make_model(config.model, config.seed, load_data(config)))


def listening(host: int) -> list[tuple[str, int, int]]:
    """(address, port, pid) of every listening TCP socket in host i (`ss -ltnp`)."""
    shown = subprocess.run(
        ["ip", "netns", "exec", namespace(host), "ss", "-Hltnp"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    found = []
    for line in shown.splitlines():
        fields = line.split()
        local = fields[3]
        where, _, port = local.rpartition(":")
        for pid in re.findall(r"pid=(\d+)", line):
            found.append((where.strip("[]"), int(port), int(pid)))
    return found


def run_tree(process: subprocess.Popen[Any]) -> dict[int, psutil.Process]:
    """A run's driver and its descendants."""
    root = psutil.Process(process.pid)
    return {p.pid: p for p in [root, *root.children(recursive=True)]}


def is_python(process: psutil.Process) -> bool:
    try:
        return "java" not in process.name()
    except psutil.Error:
        return False
