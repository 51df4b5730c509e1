"""hivemind's `test_load_state_from_peers`: a peer that joins a running run takes the run's
parameters and its place in the learning-rate schedule, not the initial ones.

Re-created from learning-at-home/hivemind, tests/test_optimizer.py, `test_load_state_from_peers`:
two peers with `nn.Linear(2, 3)`, SGD at lr 0.1 and `LambdaLR(lr_lambda=lambda t: 1 / max(1, t))`;
the second is at local epoch 1337 with every weight 42; the first loads state from its peers and
then has local epoch 1337, weights 42 and the learning rate 0.1 / 1337.

Differences, and why:
- hivemind's peers hand state to each other; ember's state lives on the parameter servers.
  The peer at 1337 is the run's worker 0, which has pushed its step 1337 and whose servers
  hold weights 42; the newcomer is a joiner (an id past the run's workers, as `ember join`
  draws), which registers, pulls, and resumes its schedule at the step the servers name.
- hivemind's "local epoch" counts its optimizer steps over the whole collaboration; ember's
  counterpart is the step the run's own workers have reached (`ClockTable.run_step`), which
  the joiner's schedule starts from while it counts its own steps from 0.
- The second case is ember's own: `ember join` on a running easgd-async run with a linear
  schedule, where the joiner's learning rate must be the run's at the step it joined, as the
  peer's scenario asks of a real process.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ember.algorithms.base import ScheduledOptimizer
from ember.algorithms.flat import FlatModel
from ember.algorithms.rules import SGDRule
from ember.config.training import CONSTANT
from ember.ps import PSClient
from tests.conftest import SECRET, running_servers
from tests.processes import has_worker_records, wait_for

JOINER = 1 << 20


def test_load_state_from_peers() -> None:
    model1, model2 = nn.Linear(2, 3), nn.Linear(2, 3)
    model2.weight.data[...] = 42
    peers = FlatModel(model2)
    peers.to_host()
    with running_servers(peers.params_np.copy(), SGDRule(lr=0.1), expected_workers=1) as (s,):
        peer = PSClient([s.address], SECRET, worker=0, timeout=10)
        peer.register()
        peer.step = 1337  # the peer's local epoch, pushed with its (empty) update
        peer.push(np.zeros(peers.size, np.float32))
        newcomer = PSClient([s.address], SECRET, worker=JOINER, timeout=10)
        newcomer.register()
        flat = FlatModel(model1)
        newcomer.pull(flat.params_np)
        flat.from_host()
        sgd = torch.optim.SGD(model1.parameters(), lr=0.1)
        schedule = torch.optim.lr_scheduler.LambdaLR(sgd, lr_lambda=lambda t: 1.0 / max(1, t))
        avgr1 = ScheduledOptimizer(sgd, list(model1.parameters()), CONSTANT, None, schedule)
        avgr1.resume_at(newcomer.run_step)
        for client in (peer, newcomer):
            client.close()
    assert newcomer.run_step == 1337 and avgr1.steps == 1337
    assert torch.all(model1.weight == 42).item()
    assert np.allclose(avgr1.optimizer.param_groups[0]["lr"], 0.1 / 1337)


def test_ember_join_takes_the_runs_learning_rate_where_the_run_stands(tmp_path: Path) -> None:
    out = tmp_path / "run"
    flags = ["--data", "digits", "--strategy", "easgd-async", "--workers", "2", "--epochs", "25"]
    flags += ["--scheduler", "linear", "--lr", "0.05", "--log-every", "10", "--out", str(out)]
    run = subprocess.Popen(
        [sys.executable, "-m", "ember", "train", *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_for(lambda: has_worker_records(out), 90), "no worker reported progress"
        joined = subprocess.run(
            [sys.executable, "-m", "ember", "join", str(out), "--epochs", "1"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert joined.returncode == 0, joined.stderr
        _, err = run.communicate(timeout=180)
        assert run.returncode == 0, err
    finally:
        run.kill()
    started = re.search(r"joined as worker \d+ at step (\d+) of the run's schedule", joined.stderr)
    assert started is not None, joined.stderr
    schedule_step = int(started.group(1))
    assert schedule_step > 0  # the run had trained: the joiner does not start at the top
    # the joiner's first record comes after its 10th step, taken at schedule step + 9
    first_lr = float(re.findall(r"step 10, loss [0-9.]+, lr ([0-9.e-]+)", joined.stderr)[0])
    total = 25 * (10_000 // 2 // 64)  # the run's schedule: its epochs of a member's batches
    assert np.isclose(first_lr, 0.05 * (1 - (schedule_step + 9) / total), rtol=1e-4)
