"""The run's optimizer and schedule against plain PyTorch: AdamW with weight decay and a cosine
schedule on the servers (bsp, state per shard) and on a worker, step for step."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ember.algorithms import FlatModel, ServerSGD, local_optimizer, make_update_rule
from ember.config import RunConfig
from ember.engines.process import free_port
from ember.errors import ConfigError
from ember.ps import fetch_state
from tests.conftest import SECRET, running_servers
from tests.integration.test_oracles import _batch, _data, _flat, _model, _run_workers

pytestmark = pytest.mark.timeout(120)
STEPS, LR, DECAY = 10, 0.01, 0.05
ADAMW = {"optimizer": "adamw", "scheduler": "cosine", "weight_decay": DECAY, "lr": LR}


def _reference(workers: int) -> torch.nn.Module:
    """Plain PyTorch: AdamW and CosineAnnealingLR over the workers' batches concatenated."""
    x, y = _data(STEPS)
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=DECAY)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=STEPS)
    for step in range(STEPS):
        batches = [_batch(x, y, step, w) for w in range(workers)]
        optimizer.zero_grad()
        inputs, labels = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
        F.cross_entropy(model(inputs), labels).backward()
        optimizer.step()
        schedule.step()
    return model


def test_bsp_with_adamw_and_a_cosine_schedule_equals_pytorch_on_the_whole_batch() -> None:
    workers = 2  # _run_workers runs the module's WORKERS (2)
    config = RunConfig(strategy="bsp", workers=workers, request_timeout=40, **ADAMW).validate()
    rule = make_update_rule(config, steps_per_worker=STEPS)
    assert rule.state_names == ("exp_avg", "exp_avg_sq")
    x, y = _data(STEPS)
    with running_servers(_flat(_model()), rule, "bsp", shards=2, expected_workers=workers) as s:
        addresses = [server.address for server in s]
        _run_workers(ServerSGD, config, addresses, STEPS, x, y, lambda m: None)
        state = fetch_state(addresses, SECRET)[0]
    np.testing.assert_allclose(state["params"], _flat(_reference(workers)), rtol=2e-5, atol=2e-6)
    assert np.abs(state["exp_avg_sq"]).sum() > 0  # the moments live with the shards


def test_one_bsp_worker_with_adamw_equals_pytorch_step_for_step() -> None:
    config = RunConfig(strategy="bsp", workers=1, request_timeout=40, **ADAMW).validate()
    rule = make_update_rule(config, steps_per_worker=STEPS)
    x, y = _data(STEPS)
    with running_servers(_flat(_model()), rule, "bsp", expected_workers=1) as servers:
        address = servers[0].address
        flat = FlatModel(_model())
        algorithm = ServerSGD.__new__(ServerSGD)
        ServerSGD.__init__(algorithm, _context(config, address))
        algorithm.start(flat, None)
        for step in range(STEPS):
            flat.zero_grad()
            inputs, labels = _batch(x, y, step, 0)
            F.cross_entropy(flat.module(inputs), labels).backward()
            algorithm.after_backward(step)
        algorithm.finish()
        params = fetch_state([address], SECRET)[0]["params"]
    np.testing.assert_allclose(params, _flat(_reference(1)), rtol=2e-5, atol=2e-6)


def _context(config: RunConfig, address: str):  # type: ignore[no-untyped-def]
    from ember.algorithms import WorkerContext

    return WorkerContext(config, 0, 1, [address], SECRET)


def test_a_workers_adamw_with_warm_up_clipping_and_schedule_equals_pytorch() -> None:
    config = RunConfig(
        strategy="single", workers=1, warmup_steps=3, clip_grad_norm=0.5, **ADAMW
    ).validate()
    x, y = _data(STEPS)
    flat = FlatModel(_model(), flat_grads=False)
    optimizer = local_optimizer(flat.module, config, total_steps=STEPS)
    reference = _model()
    torch_optimizer = torch.optim.AdamW(reference.parameters(), lr=LR, weight_decay=DECAY)
    cosine = torch.optim.lr_scheduler.LambdaLR(
        torch_optimizer,
        lambda s: min(1.0, (s + 1) / 3) * 0.5 * (1 + np.cos(np.pi * min(s, STEPS) / STEPS)),
    )
    for step in range(STEPS):
        inputs, labels = _batch(x, y, step, 0)
        for model in (flat.module, reference):
            model.zero_grad()
            F.cross_entropy(model(inputs), labels).backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
        optimizer.step()
        torch_optimizer.step()
        cosine.step()
    np.testing.assert_allclose(_flat(flat.module), _flat(reference), rtol=1e-6, atol=1e-7)


def test_allreduce_with_adamw_and_a_cosine_schedule_equals_pytorch_on_the_whole_batch(
    tmp_path: Path,
) -> None:
    """Two processes in a gloo group: the mean gradient, then each one's AdamW, as DDP."""
    address = f"tcp://127.0.0.1:{free_port()}"
    spawn = mp.get_context("spawn")
    ranks = [spawn.Process(target=_allreduce_worker, args=(r, address, tmp_path)) for r in (0, 1)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(90)
    assert [p.exitcode for p in ranks] == [0, 0]
    expected = _flat(_reference(2))
    for rank in (0, 1):
        np.testing.assert_allclose(np.load(tmp_path / f"rank{rank}.npy"), expected, 2e-5, 2e-6)


def _allreduce_worker(rank: int, address: str, out: Path) -> None:
    from ember.algorithms import WorkerContext, make_algorithm

    torch.set_num_threads(1)
    config = RunConfig(strategy="allreduce", workers=2, **ADAMW).validate()
    x, y = _data(STEPS)
    flat = FlatModel(_model(), flat_grads=config.mode.ships_gradients)
    optimizer = local_optimizer(flat.module, config, total_steps=STEPS)
    algorithm = make_algorithm(WorkerContext(config, rank, 2, rendezvous=address))
    algorithm.start(flat, optimizer)
    for step in range(STEPS):
        flat.zero_grad()
        inputs, labels = _batch(x, y, step, rank)
        F.cross_entropy(flat.module(inputs), labels).backward()
        algorithm.after_backward(step)
    algorithm.finish()
    np.save(out / f"rank{rank}.npy", _flat(flat.module))


def test_an_optimizer_and_a_schedule_handed_over_as_objects_step_as_pytorch() -> None:
    from ember.config.objects import UserObjects, object_label
    from tests.task_models import halve_every_100, rmsprop

    labels = [object_label(kind, f) for kind, f in (("o", rmsprop), ("s", halve_every_100))]
    objects = UserObjects(functions=dict(zip(labels, (rmsprop, halve_every_100), strict=True)))
    config = RunConfig(strategy="single", workers=1, optimizer=labels[0], scheduler=labels[1])
    x, y = _data(STEPS * 30)
    flat = FlatModel(_model(), flat_grads=False)
    optimizer = local_optimizer(flat.module, config.validate(), STEPS * 30, objects)
    reference = _model()
    torch_optimizer = rmsprop(reference.parameters())
    schedule = halve_every_100(torch_optimizer)
    for step in range(STEPS * 30):  # past two of the schedule's steps
        inputs, labels_ = _batch(x, y, step, 0)
        for model in (flat.module, reference):
            model.zero_grad()
            F.cross_entropy(model(inputs), labels_).backward()
        optimizer.step()
        torch_optimizer.step()
        schedule.step()
    assert torch_optimizer.param_groups[0]["lr"] == pytest.approx(2e-3 / 8)
    np.testing.assert_allclose(_flat(flat.module), _flat(reference), rtol=1e-6, atol=1e-7)


def test_an_optimizer_a_shard_cannot_run_is_refused_before_anything_starts() -> None:
    with pytest.raises(ConfigError) as refused:
        RunConfig(strategy="bsp", optimizer="lamb").validate()
    assert str(refused.value) == (
        "optimizer 'lamb' cannot run on the parameter servers of strategy 'bsp' (it needs"
        " whole-tensor norms, which a key-range shard does not hold); the servers take sgd,"
        " adam, adamw, and strategies single, easgd, easgd-async and allreduce run any"
        " torch.optim optimizer on the workers"
    )
    RunConfig(strategy="easgd-async", optimizer="rmsprop").validate()  # runs on the workers


def test_the_main_job_in_bf16_mixed_precision_reaches_the_float32_accuracy(tmp_path) -> None:
    import ember

    result = ember.fit(precision="bf16-mixed", epochs=3, out=str(tmp_path / "run"))
    assert result.summary["precision"] == result.summary["config"]["precision"] == "bf16-mixed"
    assert result.summary["devices"] == {"0": "cpu", "1": "cpu"}  # auto, where no GPU is
    assert result.summary["test_accuracy"] >= 0.97
    # the parameters, exchanges and the model a run returns stay float32
    assert all(p.dtype == torch.float32 for p in result.model.parameters())


def test_an_unknown_precision_is_one_error_naming_the_choices() -> None:
    with pytest.raises(ConfigError) as refused:
        RunConfig(precision="bf16").validate()
    assert str(refused.value) == "precision must be one of 32, bf16-mixed, 16-mixed; got 'bf16'"


@pytest.mark.parametrize("strategy", ["single", "bsp"])
def test_16_mixed_precision_trains_with_float32_parameters_and_exchanges(tmp_path, strategy):
    import ember

    workers = 1 if strategy == "single" else 2
    out = str(tmp_path / "run")
    result = ember.fit(data="digits", precision="16-mixed", strategy=strategy, workers=workers,
                       epochs=2, device="cpu", out=out)  # fmt: skip
    assert result.summary["precision"] == "16-mixed" and result.summary["device"] == "cpu"
    assert set(result.summary["devices"].values()) == {"cpu"}
    assert result.summary["test_accuracy"] >= 0.85
    assert all(p.dtype == torch.float32 for p in result.model.parameters())
