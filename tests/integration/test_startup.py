"""The local engine's start-up and data: each worker process maps its own shard of the one
copy of the data, and the summary says where the run's seconds and memory went."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import ember
from ember.data import shard_indices
from ember.engines.phases import PHASES
from tests.processes import log_of, run_python

pytestmark = pytest.mark.timeout(240)
SRC = str(Path(ember.__file__).resolve().parents[1])
ROWS, FEATURES, WORKERS = 60_000, 50, 2


def data_mappings(pid: int) -> dict[str, int]:
    """Bytes a process has mapped of each of a run copy's .npy files, by file name."""
    mapped: dict[str, int] = {}
    try:
        lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    except OSError:
        return mapped
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and "/ember-data-" in fields[5] and fields[5].endswith(".npy"):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            name = Path(fields[5]).name
            mapped[name] = mapped.get(name, 0) + end - start
    return mapped


def test_each_worker_maps_its_shard_alone_and_the_summary_times_the_phases(tmp_path) -> None:
    out = tmp_path / "run"
    data = ["--data", "synthetic-lr", "--synthetic-samples", str(ROWS)]
    data += ["--synthetic-features", str(FEATURES)]
    run = ["--model", "logreg", "--workers", str(WORKERS), "--epochs", "10", "--strategy", "async"]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "ember", "train", *data, *run, "--out", str(out)],
        env={**os.environ, "PYTHONPATH": SRC},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: dict[int, dict[str, int]] = {}  # rank -> what its process mapped
    try:
        deadline = time.monotonic() + 180
        while launcher.poll() is None and len(seen) < WORKERS and time.monotonic() < deadline:
            for child in psutil.Process(launcher.pid).children(recursive=True):
                log = log_of(child)
                for rank in range(WORKERS):
                    if f"worker-{rank}.log" in log and (maps := data_mappings(child.pid)):
                        seen[rank] = maps
            time.sleep(0.05)
        _, stderr = launcher.communicate(timeout=180)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(10)
    assert launcher.returncode == 0, stderr
    assert sorted(seen) == list(range(WORKERS)), f"saw the mappings of ranks {sorted(seen)}"
    shard_bytes = len(shard_indices(ROWS, 0, WORKERS)) * FEATURES * 4
    for rank, maps in seen.items():
        # its rows of the training features, and at most the pages they start and end in
        assert shard_bytes <= maps["x_train.npy"] < shard_bytes + 2 * 4096, (rank, maps)
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["phases"]) == set(PHASES)
    assert all(seconds >= 0 for seconds in summary["phases"].values())
    startup = sum(summary["phases"][p] for p in ("launch", "data", "model", "servers", "workers"))
    assert summary["startup_seconds"] == pytest.approx(startup, abs=1e-3)
    assert summary["teardown_seconds"] > 0 and summary["phases"]["teardown"] > 0
    # the launcher and both workers at least, each holding more than the shard
    assert summary["peak_memory_bytes"] > 3 * shard_bytes
    assert summary["test_accuracy"] > 0.75
    assert not list(Path("/dev/shm").glob(f"ember-data-{launcher.pid}-*"))  # its copy is gone


# A whole local run, then what it left loaded: the launcher has the model's starting
# parameters and final evaluation worked out by forks of the fork server, never torch itself.
RUN = """
import json, sys
from ember.api import run_config
from ember.engines import LocalEngine, ParsedRun

fields = dict(data="synthetic-lr", model="logreg", synthetic_samples=4000, epochs=1, workers=2)
run = ParsedRun(run_config({"out": sys.argv[1], **fields}), show_progress=False)
result = run.execute(LocalEngine())
mapped = "/ember-data-" in open("/proc/self/maps").read()  # the run's removed data copy
print(json.dumps({"torch": "torch" in sys.modules, "mapped": mapped, "summary": result.summary}))
import torch
from ember.checkpoint import load_checkpoint
saved = load_checkpoint(result.summary["checkpoint"]).tensors["params"]
model = result.model  # built here, on first use
print(json.dumps({"module": isinstance(model, torch.nn.Module),
    "same": bool(torch.equal(torch.cat([p.reshape(-1) for p in model.parameters()]),
        torch.from_numpy(saved)))}))
"""


def test_the_launcher_of_a_local_run_never_imports_torch(tmp_path: Path) -> None:
    done = run_python(RUN, str(tmp_path / "run"), timeout=180)
    ran, model = (json.loads(line) for line in done.stdout.splitlines()[-2:])
    assert ran["torch"] is False
    assert ran["mapped"] is False  # the result keeps no mapping of the data it trained on
    assert ran["summary"]["test_accuracy"] > 0.7  # its evaluation happened, in a fork
    assert "model" in ran["summary"]["phases"]
    assert model == {"module": True, "same": True}  # the final parameters, as checkpointed
