"""`ember.run` runs the user's own loop on every worker: ember.Optimizer around AdamW does the
run's exchange under each strategy, ctx.report() reaches metrics.jsonl, a worker killed
mid-run is restarted and resumes, and what cannot work is one clear error."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ember
from ember.checkpoint import load_checkpoint
from ember.config import STRATEGIES
from ember.data.generate import generate
from ember.errors import ConfigError, EmberError, WorkerFailed
from ember.metrics import read_metrics

pytestmark = pytest.mark.timeout(240)

LR = 3e-3
EPOCHS = 6  # easgd-async's rank 0 is above 0.97 by then, its local model trailing the center


def separable(rows: int = 4000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 8)).astype(np.float32)
    return x, (x[:, 0] - x[:, 3] > 0).astype(np.int64)


def make_mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))


def train(kill_at: int | None = None, marker: str | None = None) -> dict[str, Any]:
    """AdamW on the worker's shard; `kill_at`: rank 1's first incarnation dies at that step
    (first: incarnation 0, or with a `marker` file, the one that finds none and leaves it)."""
    ctx = ember.context()
    model = make_mlp()
    optimizer = ember.Optimizer(torch.optim.AdamW(model.parameters(), lr=LR), model)
    for epoch in range(ctx.start_epoch, ctx.epochs):  # a restarted rank goes on where it was
        for inputs, targets in ctx.data.batches(epoch):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(inputs), targets)
            loss.backward()
            optimizer.step()
            if kill_at == ctx.step and ctx.rank == 1 and first_time(ctx.incarnation, marker):
                os.kill(os.getpid(), signal.SIGKILL)
        ctx.report(loss=loss.item(), seen=ctx.data.batch_size * ctx.step)
    with torch.no_grad():
        predicted = model(torch.from_numpy(np.asarray(ctx.data.x_test))).argmax(dim=1)
    accuracy = (predicted.numpy() == np.asarray(ctx.data.y_test)).mean()
    where = str(ctx.device)  # where the loop's model belongs: the CPU here, under auto
    return {"rank": ctx.rank, "world": ctx.world, "accuracy": accuracy, "weight": model[0].weight,
            "device": where}  # fmt: skip


def train_leaving_the_optimizer_to_the_servers() -> float:
    """Under bsp the servers run the run's optimizer: the loop wraps none of its own."""
    ctx = ember.context()
    model = make_mlp()
    optimizer = ember.Optimizer(None, model)
    for epoch in range(ctx.start_epoch, ctx.epochs):
        for inputs, targets in ctx.data.batches(epoch):
            optimizer.zero_grad()
            F.cross_entropy(model(inputs), targets).backward()
            optimizer.step()
    with torch.no_grad():
        predicted = model(torch.from_numpy(np.asarray(ctx.data.x_test))).argmax(dim=1)
    return float((predicted.numpy() == np.asarray(ctx.data.y_test)).mean())


def make_linear() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(16, 2)


def train_on_streamed_rows() -> dict[str, Any]:
    """Rows streamed from disk: no arrays to read, the batches all the same."""
    ctx = ember.context()
    model = make_linear()
    optimizer = ember.Optimizer(torch.optim.AdamW(model.parameters(), lr=1e-2), model)
    for epoch in range(ctx.start_epoch, ctx.epochs):
        for inputs, targets in ctx.data.batches(epoch):
            optimizer.zero_grad()
            F.cross_entropy(model(inputs), targets).backward()
            optimizer.step()
    x_test, y_test = np.asarray(ctx.data.x_test), np.asarray(ctx.data.y_test)
    with torch.no_grad():
        predicted = model(torch.from_numpy(x_test)).argmax(dim=1).numpy()
    majority = np.bincount(y_test).max() / len(y_test)
    return {"x": ctx.data.x is None, "accuracy": (predicted == y_test).mean(), "majority": majority}


def first_time(incarnation: int, marker: str | None) -> bool:
    if marker is None:
        return incarnation == 0
    if Path(marker).exists():
        return False
    Path(marker).touch()
    return True


def train_returning_the_model() -> Any:
    model = make_mlp()
    ember.Optimizer(torch.optim.AdamW(model.parameters(), lr=LR), model)
    return {"model": model}


def train_another_model() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    ember.Optimizer(torch.optim.AdamW(net.parameters(), lr=LR), net)


def user_run(tmp_path: Path, strategy: str, *args: Any, **fields: Any) -> Any:
    if strategy not in ("single", "allreduce"):
        fields.setdefault("model", make_mlp)  # the servers start from its parameters
    fields.setdefault("tau", 4)
    fields.setdefault("epochs", EPOCHS)
    return ember.run(
        train,
        *args,
        data=separable(),
        strategy=strategy,
        workers=1 if strategy == "single" else 2,
        optimizer="adamw",
        lr=LR,
        out=str(tmp_path / "run"),
        **fields,
    )


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_user_loop_trains_with_adamw_and_returns_rank_0s_value(
    tmp_path: Path, strategy: str
) -> None:
    value = user_run(tmp_path, strategy)
    workers = 1 if strategy == "single" else 2
    assert value["rank"] == 0 and value["world"] == workers
    assert value["accuracy"] >= 0.95
    assert isinstance(value["weight"], torch.Tensor) and value["weight"].shape == (32, 8)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["user_loop"] and summary["strategy"] == strategy
    assert value["device"] == "cpu" and set(summary["devices"].values()) == {"cpu"}
    # the servers hold make_mlp's 354 parameters; without servers the launcher has no model
    assert summary["parameters"] == (0 if strategy in ("single", "allreduce") else 354)
    # 3600 training rows (a tenth held out), whole batches of 64 per worker
    assert summary["samples"] == EPOCHS * (3600 // workers // 64) * 64 * workers
    reports = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "seen" in r]
    assert sorted((r["rank"], r["epoch"]) for r in reports) == sorted(
        (rank, epoch) for rank in range(workers) for epoch in range(1, EPOCHS + 1)
    )
    assert all(r["kind"] == "worker" and r["reported"] == ["loss", "seen"] for r in reports)
    assert all(r["loss"] < 0.5 for r in reports if r["epoch"] == EPOCHS)
    # where the run knows the model (model=), the servers' final parameters are exported as
    # every run's are; without servers rank 0 kept its model to itself
    exported = (tmp_path / "run" / "model.safetensors").exists()
    assert summary["model_file"] == ("model.safetensors" if exported else None)
    assert exported == (strategy not in ("single", "allreduce"))
    if exported:
        saved = load_checkpoint(tmp_path / "run" / "checkpoints").tensors["params"]
        loaded = ember.load(tmp_path / "run", model=make_mlp())
        flat = torch.cat([t.reshape(-1) for t in loaded.state_dict().values()])
        np.testing.assert_array_equal(flat.numpy(), saved)


@pytest.mark.parametrize("strategy", ["bsp", "easgd-async"])
def test_a_worker_killed_mid_run_is_restarted_and_resumes_from_the_servers(
    tmp_path: Path, strategy: str
) -> None:
    value = user_run(tmp_path, strategy, 30)
    assert value["rank"] == 0 and value["accuracy"] >= 0.95
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    restarts = [r for r in records if r["kind"] == "restart"]
    assert [(r["rank"], r["incarnation"], r["exitcode"]) for r in restarts] == [
        (1, 1, -signal.SIGKILL)
    ]
    again = [r for r in records if r["kind"] == "start" and r["incarnation"] == 1]
    assert len(again) == 1 and again[0]["first_step"] > 0  # the servers' record of its steps
    done = [r for r in records if r["kind"] == "done"]
    assert sorted((r["rank"], r["incarnation"]) for r in done) == [(0, 0), (1, 1)]


def test_an_adaptive_tau_chooses_its_periods_from_the_optimizers_step_times(
    tmp_path: Path,
) -> None:
    # From tau 1 the policy must rise: until a period has clean steps to tell an exchange's
    # cost apart from compute, it keeps tau at PROBE (4) or more, and it changes tau once
    # settled (SETTLE_STEPS local steps): 12 epochs of 28 batches are past that.
    value = user_run(tmp_path, "easgd-async", tau=1, tau_policy="auto", epochs=12)
    assert value["accuracy"] >= 0.95
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["tau_policy"] == "auto" and set(summary["tau_per_worker"]) == {"0", "1"}
    chosen = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "tau"]
    assert {r["rank"] for r in chosen} == {0, 1}
    assert all(r["policy"] == "auto" and 1 <= r["tau"] <= 256 for r in chosen)
    # the first period is the one asked for; a later choice rests on the steps timed
    assert all(r["reason"] == "start" for r in chosen if r["previous"] is None)
    later = [r for r in chosen if r["previous"] is not None]
    assert {r["rank"] for r in later} == {0, 1}
    assert all(r["previous"] == 1 and r["tau"] >= 4 and r["t_comp"] > 0 for r in later[:1])


def test_tau_loss_in_a_user_loop_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"ember\.run takes a fixed tau or tau 'auto'"):
        user_run(tmp_path, "easgd-async", tau="loss")
    assert not (tmp_path / "run").exists()


def test_under_bsp_the_loop_may_leave_the_optimizer_to_the_servers(tmp_path: Path) -> None:
    accuracy = ember.run(
        train_leaving_the_optimizer_to_the_servers,
        data=separable(),
        model=make_mlp,
        strategy="bsp",
        workers=2,
        epochs=EPOCHS,
        optimizer="adamw",
        lr=LR,
        out=str(tmp_path / "run"),
    )
    assert accuracy >= 0.95


def test_a_user_loop_reads_rows_streamed_from_disk(tmp_path: Path) -> None:
    data = tmp_path / "lr"
    written = generate(
        "synthetic-lr", 8000 * (16 * 4 + 8), data, features=16, row_group_bytes=40_000
    )
    value = ember.run(
        train_on_streamed_rows,
        data=str(data),
        data_mode="stream",
        strategy="easgd-async",
        model=make_linear,
        workers=2,
        epochs=2,
        batch_size=32,
        optimizer="adamw",
        lr=1e-2,
        out=str(tmp_path / "run"),
    )
    assert value["x"] and value["accuracy"] > value["majority"] + 0.1
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["data_mode"] == "stream"
    shards = summary["data_per_worker"]
    assert set(shards) == {"0", "1"}
    assert summary["rows_read"] == 2 * written.train_rows  # each worker its shard, each epoch


def test_a_mismatched_optimizer_under_bsp_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(WorkerFailed) as failed:
        ember.run(
            train,
            data=separable(),
            model=make_mlp,
            strategy="bsp",
            optimizer="sgd",
            lr=0.05,
            out=str(tmp_path / "run"),
        )
    assert (
        "ConfigError: strategy 'bsp' applies updates on the parameter servers with the run's"
        " optimizer 'sgd' (lr 0.05), but ember.Optimizer wraps AdamW (lr 0.003); pass"
        " ember.run optimizer='adamw' and lr=0.003, or wrap the run's optimizer"
    ) in str(failed.value)
    assert "not restarted: it would fail again" in str(failed.value)


def test_a_loop_model_that_does_not_fit_the_servers_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(WorkerFailed) as failed:
        ember.run(
            train_another_model,
            data=separable(),
            model=make_mlp,
            strategy="easgd-async",
            out=str(tmp_path / "run"),
        )
    assert (
        "ConfigError: ember.Optimizer's model has 178 parameters and 0 buffer values, but the"
        " servers hold 354 and 0, the state of ember.run's model=" in str(failed.value)
    )


def test_a_return_value_that_cannot_be_encoded_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EmberError) as refused:
        ember.run(
            train_returning_the_model,
            data=separable(),
            strategy="single",
            workers=1,
            epochs=1,
            out=str(tmp_path / "run"),
        )
    assert str(refused.value) == (
        "ember.run: the return value holds a torch.nn.modules.container.Sequential, which"
        " cannot travel from the worker without pickle; return numbers, strings, bytes,"
        " lists, dicts, None, NumPy arrays or torch tensors (e.g. model.state_dict() rather"
        " than the model)"
    )


def test_a_strategy_with_servers_needs_the_model_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        ember.run(train, data=separable(), strategy="bsp", out=str(tmp_path / "run"))
    assert str(refused.value).startswith(
        "ember.run with strategy 'bsp' needs model= (the module train_fn trains"
    )
    assert not (tmp_path / "run").exists()


def test_a_lambda_and_a_closure_reach_the_workers_as_torchdistributor_ships_them(
    tmp_path: Path,
) -> None:
    assert ember.run(lambda: 1, strategy="single", workers=1, out=str(tmp_path / "a")) == 1
    offset = 41

    def closure(step: int) -> int:
        return ember.context().rank + step + offset

    assert ember.run(closure, 1, strategy="single", workers=1, out=str(tmp_path / "b")) == 42


def test_arguments_the_workers_cannot_be_handed_are_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError) as refused:
        ember.run(train, threading.Lock(), strategy="single", workers=1, out=str(tmp_path / "r"))
    assert str(refused.value).startswith("train_fn <function train")
    assert "cannot be handed to the local engine's workers (TypeError" in str(refused.value)
    assert not (tmp_path / "r").exists()


def test_context_and_optimizer_outside_a_run_say_so() -> None:
    said = r"ember.context\(\) and ember.Optimizer are for the function ember.run runs"
    with pytest.raises(EmberError, match=said):
        ember.context()
    model = make_mlp()
    with pytest.raises(EmberError, match=said):
        ember.Optimizer(torch.optim.AdamW(model.parameters()), model)


def train_reporting_its_epochs() -> None:
    """A loop written for TorchDistributor: it reports its own epoch with its loss."""
    ctx = ember.context()
    model = make_mlp()
    optimizer = ember.Optimizer(torch.optim.AdamW(model.parameters(), lr=LR), model)
    for epoch in range(ctx.epochs):
        for inputs, targets in ctx.data.batches(epoch):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(inputs), targets)
            loss.backward()
            optimizer.step()
        ctx.report(epoch=10 + epoch, loss=loss.item())


def test_a_loop_may_report_its_own_epoch(tmp_path: Path) -> None:
    ember.run(
        train_reporting_its_epochs,
        data=separable(),
        strategy="single",
        epochs=2,
        out=str(tmp_path / "run"),
    )
    reports = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "reported" in r]
    assert [(r["epoch"], r["reported"]) for r in reports] == [(10, ["loss"]), (11, ["loss"])]


def train_on_its_own_data() -> float:
    """A TorchDistributor loop: it makes its own data, reading nothing of ctx.data."""
    ctx = ember.context()
    model = make_mlp()
    optimizer = ember.Optimizer(torch.optim.AdamW(model.parameters(), lr=LR), model)
    generator = torch.Generator().manual_seed(ctx.rank)
    for _ in range(60):
        inputs = torch.randn(64, 8, generator=generator)
        targets = (inputs[:, 0] > 0).long()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
    return float(loss)


def test_a_loop_that_brings_its_own_data_needs_no_data(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Without data=, model= (8 inputs) is not tried on the default data's rows (MNIST's
    28x28, a shape error before), and the run says so."""
    loss = ember.run(
        train_on_its_own_data,
        model=make_mlp,
        strategy="easgd-async",
        workers=2,
        tau=4,
        out=str(tmp_path / "run"),
    )
    assert loss < 0.5
    assert "ember.run was given no data=: the loop reads its own" in capfd.readouterr().err
