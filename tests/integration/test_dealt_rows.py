"""Ray Train's replica-replacement scenarios on a worker range's run: 2 workers, 100 rows, a
worker failing after 20 rows, at an epoch boundary, twice on one rank, on both ranks. A
collector records every row each worker trains; the rows are dealt by the servers in pieces
(ps/pieces.py), so every row is trained once per epoch where no step was in flight and at
least once otherwise, and summary.json's counts agree with the collector."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ember
from ember.metrics import read_metrics
from tests.processes import has_worker_records, wait_for

ROWS, EPOCHS, BATCH = 100, 2, 10
# a step's time, so that a restarted worker (about a second to start) still finds rows dealt
STEP_SECONDS = 0.15


def rows_with_ids() -> tuple[np.ndarray, np.ndarray]:
    """Row i's first feature is i, so that a batch says which rows it holds."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 4)).astype(np.float32)
    x[:, 0] = np.arange(ROWS)
    return x, (x[:, 1] > 0).astype(np.int64)


def make_net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 2)


def train(out: str, failures: dict[int, list[Any]]) -> None:
    """Train on the rows dealt, appending each batch's (epoch, row) to this incarnation's
    collector file before its step; `failures[rank][incarnation]` says when that one dies:
    after that many rows, or "boundary" after its first epoch."""
    ctx = ember.context()
    plan = failures.get(ctx.rank, [])
    dies = plan[ctx.incarnation] if ctx.incarnation < len(plan) else None
    net = make_net()
    optimizer = ember.Optimizer(torch.optim.SGD(net.parameters(), lr=0.05), net)
    (Path(out) / f"ready-{ctx.rank}").touch()  # both in before either trains: each gets rows
    deadline = time.monotonic() + 60
    while len(list(Path(out).glob("ready-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    trained = 0
    with open(Path(out) / f"rows-{ctx.rank}-{ctx.incarnation}.txt", "a") as collector:
        for epoch in range(ctx.start_epoch, ctx.epochs):
            for x, y in ctx.data.batches(epoch):
                rows = " ".join(f"{ctx.epoch}:{int(r)}" for r in x[:, 0].tolist())
                collector.write(rows + "\n")
                collector.flush()
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(net(x), y).backward()
                optimizer.step()
                time.sleep(STEP_SECONDS)
                trained += len(y)
                if dies == trained:
                    os._exit(3)  # a crash: nothing said to anyone
            if dies == "boundary":
                os._exit(3)


def collected(out: Path) -> dict[int, Counter[int]]:
    """How many times each row was trained, per epoch, over every worker's collector."""
    per_epoch: dict[int, Counter[int]] = {e: Counter() for e in range(EPOCHS)}
    for path in out.glob("rows-*.txt"):
        for line in path.read_text().split():
            epoch, row = line.split(":")
            per_epoch[int(epoch)][int(row)] += 1
    return per_epoch


def run_collected(
    tmp_path: Path, failures: dict[int, list[Any]], batch_size: int, **given: Any
) -> tuple[dict[str, Any], dict[int, Counter[int]]]:
    """An async run of `train` on workers=(2, 3): its summary and the collector's counts."""
    collector = tmp_path / "collector"
    collector.mkdir()
    x, y = rows_with_ids()
    data = given or {"data": (x, y), "test_data": (x[:20], y[:20])}
    ember.run(
        train,
        str(collector),
        failures,
        model=make_net,
        **data,
        strategy="async",
        workers=(2, 3),
        epochs=EPOCHS,
        batch_size=batch_size,
        out=str(tmp_path / "run"),
    )
    return json.loads((tmp_path / "run" / "summary.json").read_text()), collected(collector)


@pytest.mark.parametrize(
    ("failures", "in_flight"),
    [
        ({1: [20]}, True),  # a worker fails after 20 rows
        ({1: ["boundary"]}, False),  # at an epoch boundary: no step in flight
        ({1: [20, 20]}, True),  # twice on one rank
        ({0: [20], 1: [30]}, True),  # both ranks
    ],
    ids=["after-20-rows", "epoch-boundary", "twice-on-one-rank", "both-ranks"],
)
def test_every_row_is_trained_once_an_epoch_or_at_least_once_when_a_step_was_in_flight(
    tmp_path: Path, failures: dict[int, list[Any]], in_flight: bool
) -> None:
    summary, counts = run_collected(tmp_path, failures, BATCH)
    deaths = sum(len(plan) for plan in failures.values())
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    restarts = [r for r in records if r.get("kind") == "restart"]
    assert len(restarts) == deaths  # each dead worker was replaced, as Ray replaces a replica
    twice = 0
    for epoch in range(EPOCHS):
        assert set(counts[epoch]) == set(range(ROWS)), f"epoch {epoch} missed rows"
        twice += sum(n - 1 for n in counts[epoch].values())
    assert summary["epoch_rows"] == [ROWS] * EPOCHS  # each row once, as the servers count
    assert summary["rows_trained_twice"] == twice
    assert summary["samples"] == ROWS * EPOCHS + twice  # every incarnation's rows
    if in_flight:  # the dead worker's last batch was trained again by whoever took it
        assert twice == BATCH * deaths
    else:
        assert twice == 0


def test_a_member_dying_inside_a_piece_of_several_batches_has_it_trained_again_whole(
    tmp_path: Path,
) -> None:
    """Batches of 2: 50 an epoch, dealt in pieces of 2 batches (piece_batches at MAX 3). A
    worker dying after 22 rows is inside its sixth piece: the piece is dealt again whole, so
    its first batch is trained twice, and the servers count those 2 rows: the steps they
    folded from it since it started the piece, times its batch size."""
    summary, counts = run_collected(tmp_path, {1: [22]}, batch_size=2)
    assert summary["pieces_per_epoch"] == 25
    twice = 0
    for epoch in range(EPOCHS):
        assert set(counts[epoch]) == set(range(ROWS)), f"epoch {epoch} missed rows"
        twice += sum(n - 1 for n in counts[epoch].values())
    assert summary["epoch_rows"] == [ROWS] * EPOCHS
    assert twice == 2  # the dead worker's half of its piece
    assert (summary["rows_trained_twice"], summary["pieces_reissued"]) == (2, 1)


@pytest.mark.parametrize("data_mode", ["memory", "stream"])
def test_a_range_resumed_from_its_last_checkpoint_goes_on_mid_epoch(
    tmp_path: Path, data_mode: str
) -> None:
    """SIGTERM writes a last checkpoint with the data cursor; --resume deals only the pieces
    that were not done, so each epoch's rows add up to the set once over both runs, whether
    the members hold the rows or stream them from disk (the cursor counts pieces, not where
    their rows are kept)."""
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "ember", "train", "--data", "digits", "--strategy", "async"]
    argv += ["--data-mode", data_mode]
    argv += ["--workers", "2:3", "--epochs", "6", "--log-every", "10", "--out", str(out)]
    launcher = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: has_worker_records(out), 90), "no worker reported progress"
        launcher.send_signal(signal.SIGTERM)
        launcher.communicate(timeout=60)
    finally:
        launcher.kill()
    assert launcher.returncode == 128 + signal.SIGTERM
    newest = (out / "checkpoints" / "last").read_text().strip()  # the newest one's name
    last = json.loads((out / "checkpoints" / newest / "manifest.json").read_text())
    cursor = last["meta"]["pieces"]
    assert sum(cursor["epoch_rows"]) > 0 and cursor["frontier"] < 6, cursor
    resumed = subprocess.run(
        [*argv, "--resume", "auto"], capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads((out / "summary.json").read_text())
    rows = summary["epoch_rows"][-1]
    assert summary["epoch_rows"] == [rows] * 6  # what the first run trained is not again
    assert summary["rows_trained_twice"] == 0
    done = [r for r in read_metrics(out / "metrics.jsonl") if r.get("kind") == "done"]
    trained_after = sum(r["samples"] for r in done)
    assert trained_after == 6 * rows - sum(cursor["epoch_rows"])  # mid-epoch, not from 0
    assert {r["data_mode"] for r in done} == {data_mode}


def test_a_streamed_range_deals_row_groups_and_trains_each_row_once_an_epoch(
    tmp_path: Path,
) -> None:
    """The rows stay on disk (--data-mode stream) in row groups of 25: each epoch the groups
    are dealt as pieces in a seeded order, and a member reads only the pieces it is dealt.
    A worker dying after 20 rows leaves its piece to be dealt again."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    x, y = rows_with_ids()
    folder = tmp_path / "rows"
    folder.mkdir()
    for name, rows in (("train", slice(None)), ("test", slice(0, 20))):
        table = pa.table({"features": pa.array(list(x[rows]), pa.list_(pa.float32())),
                          "label": pa.array(y[rows])})  # fmt: skip
        pq.write_table(table, folder / f"{name}.parquet", row_group_size=25)
    summary, counts = run_collected(
        tmp_path, {1: [20]}, BATCH, data=str(folder), data_mode="stream"
    )
    twice = 0
    for epoch in range(EPOCHS):
        assert set(counts[epoch]) == set(range(ROWS)), f"epoch {epoch} missed rows"
        twice += sum(n - 1 for n in counts[epoch].values())
    assert summary["epoch_rows"] == [ROWS] * EPOCHS
    assert summary["pieces_per_epoch"] == 10  # the least a dealing costs: a batch a piece
    assert 0 < twice <= summary["rows_trained_twice"] == BATCH
    done = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r.get("kind") == "done"]
    assert all(r["data_mode"] == "stream" for r in done)
    assert sum(r["rows_read"] for r in done) >= ROWS * EPOCHS  # read where trained, not held
