"""A loop written for torchrun or TorchDistributor under ember.run, unchanged: env:// from the
variables each worker is given, DDP and DistributedSampler under allreduce; under a strategy
with servers, init_process_group is one clear error."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.errors import EmberError


def ddp_loop(lr: float) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data.distributed import DistributedSampler

    dist.init_process_group("gloo")  # env://, as under torchrun
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=generator)
    rows = torch.utils.data.TensorDataset(x, (x.sum(1) > 0).long())
    loader = torch.utils.data.DataLoader(rows, batch_size=32, sampler=DistributedSampler(rows))
    torch.manual_seed(int(os.environ["RANK"]))  # different starts: DDP's broadcast evens them
    model = DDP(torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for inputs, labels in loader:
        optimizer.zero_grad()
        F.cross_entropy(model(inputs), labels).backward()
        optimizer.step()
    weight = model.module.weight.detach()
    every = [torch.zeros_like(weight) for _ in range(dist.get_world_size())]
    dist.all_gather(every, weight)
    ctx = ember.context()
    told = {n: os.environ[n] for n in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    dist.destroy_process_group()
    return {
        "told": told,
        "context": (ctx.rank, ctx.world),
        "equal": all(torch.equal(every[0], w) for w in every),
        "trained": not torch.equal(every[0], torch.zeros_like(weight)),
    }


def test_a_ddp_loop_runs_unchanged_under_allreduce(tmp_path: Path) -> None:
    value = ember.run(ddp_loop, 0.1, strategy="allreduce", workers=2, out=str(tmp_path))
    assert value["told"] == {
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
    }
    assert value["context"] == [0, 2]  # msgpack brings a tuple back as a list
    assert value["equal"] and value["trained"]  # the gradients were all-reduced every step


def test_a_ddp_loop_under_a_strategy_with_servers_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EmberError) as refused:
        ember.run(
            ddp_loop,
            0.1,
            strategy="async",
            workers=2,
            model=torch.nn.Linear(8, 2),
            out=str(tmp_path),
        )
    said = str(refused.value)
    assert "strategy 'async' trains through the parameter servers" in said
    assert "strategy='allreduce', or drop DDP and wrap its optimizer in ember.Optimizer" in said


def make_net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def optimizer_loop(lr: float) -> dict[str, torch.Tensor]:
    ctx, net = ember.context(), make_net()
    optimizer = ember.Optimizer(torch.optim.SGD(net.parameters(), lr=lr), net)
    for epoch in range(ctx.start_epoch, ctx.epochs):
        for inputs, labels in ctx.data.batches(epoch):
            optimizer.zero_grad()
            F.cross_entropy(net(inputs), labels).backward()
            optimizer.step()
    return {name: value.detach().clone() for name, value in net.state_dict().items()}


def test_under_allreduce_the_model_the_run_knows_is_written_as_model_safetensors(
    tmp_path: Path,
) -> None:
    from safetensors.torch import load_file

    x = torch.randn(512, 8, generator=torch.Generator().manual_seed(1)).numpy()
    y = (x.sum(1) > 0).astype("int64")
    state = ember.run(
        optimizer_loop,
        0.1,
        data=(x, y),
        model=make_net,
        strategy="allreduce",
        workers=2,
        epochs=2,
        optimizer="sgd",
        out=str(tmp_path),
    )
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert saved.keys() == state.keys()
    for name, value in state.items():  # rank 0's final parameters, which every rank holds
        torch.testing.assert_close(saved[name], value)
    assert not torch.equal(saved["0.weight"], make_net().state_dict()["0.weight"])
