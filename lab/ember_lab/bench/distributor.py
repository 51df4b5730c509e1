"""The TorchDistributor row of `ember bench` on emulated links: what a Spark user would run
instead of ember. PySpark's TorchDistributor (num_processes = the worker hosts, local_mode off,
no GPU) starts one barrier task per host, each running torchrun, and its training function trains
ember's model with DistributedDataParallel over gloo: the same model (ember.models.zoo), the same
data shards (shard_indices), per-worker batch, epochs, learning rate and momentum as ember's
rows. Rank 0 evaluates on the test set as often as ember's worker 0 does, outside the training
clock, so time to target compares with theirs.

The function returns its figures as a JSON string: Spark carries that back as it carries any
task's result, and nothing else of the run is unpickled on the driver.
"""

from __future__ import annotations

import gc
import json
import time
from datetime import timedelta
from typing import Any

from ember.probe import Dataset

GLOO_TIMEOUT = 300.0  # seconds a collective may wait for a peer before it fails


def run_distributor(spark: Any, spec: dict[str, Any], dataset: Dataset) -> dict[str, Any]:
    """Train with TorchDistributor on `spark`'s cluster; the row's figures."""
    from pyspark.ml.torch.distributor import TorchDistributor

    from ember.config import RunConfig

    defaults = RunConfig()
    task = spec["task"]
    job = {
        **spec,
        "batch_size": defaults.batch_size,
        "momentum": defaults.momentum,
        "lr": task["lr"],
        "epochs": task["epochs"],
    }
    distributor = TorchDistributor(num_processes=spec["workers"], local_mode=False, use_gpu=False)
    text = distributor.run(train_ddp, json.dumps(job))
    if not isinstance(text, str) or not text:
        raise RuntimeError(f"TorchDistributor's rank 0 returned no figures, but {text!r}")
    figures: dict[str, Any] = json.loads(text)
    figures["config"] = {**job, "system": "TorchDistributor", "backend": "gloo"}
    return figures


def train_ddp(job_text: str) -> str:
    """One torchrun process: DDP training of its shard; rank 0 returns the figures as JSON."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from ember.probe import build_model, evaluate, evaluates_after, shard_indices
    from ember_lab.bench.rows import Task

    job = json.loads(job_text)
    torch.set_num_threads(1)  # one core per host, as ember's workers get
    dist.init_process_group("gloo", timeout=timedelta(seconds=GLOO_TIMEOUT))
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        task = Task(**job["task"])
        dataset = task.load(job["seed"])
        rows = shard_indices(len(dataset.x_train), rank, world)
        x = torch.from_numpy(dataset.x_train[rows[0] : rows[-1] + 1].copy())
        y = torch.from_numpy(dataset.y_train[rows[0] : rows[-1] + 1].copy())
        model = build_model(task.model, dataset.input_shape, dataset.num_classes, seed=job["seed"])
        ddp = DistributedDataParallel(model)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=job["lr"], momentum=job["momentum"])
        batch, steps = job["batch_size"], len(y) // job["batch_size"]  # equal shards: equal steps
        generator = torch.Generator().manual_seed(job["seed"] + rank)
        metric = task.target_metric
        clock, samples, curve = 0.0, 0, []
        for epoch in range(job["epochs"]):
            order = torch.randperm(len(y), generator=generator)
            for step in range(steps):
                started = time.perf_counter()
                rows_now = order[step * batch : (step + 1) * batch]
                model.train()
                loss = F.cross_entropy(ddp(x[rows_now]), y[rows_now])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()  # DDP all-reduces the gradients here
                optimizer.step()
                clock += time.perf_counter() - started
                samples += batch * world
                if rank == 0 and evaluates_after(epoch * steps + step, steps, job["eval_every"]):
                    scores = evaluate(model, dataset.x_test, dataset.y_test)
                    curve.append([clock, samples, scores[metric]])
        if rank == 0:
            scores = evaluate(model, dataset.x_test, dataset.y_test)
        # Every rank leaves together. A rank that had torn its process group down while rank 0
        # still evaluated once aborted at exit on a loaded host, and torchrun's agents then
        # waited out their exit barrier (300 s) before the row could end.
        dist.barrier()
        del ddp, optimizer  # the reducer holds the process group; release it before its teardown
        gc.collect()
        if rank != 0:
            return ""
        parameters = sum(p.numel() * p.element_size() for p in model.parameters())
        # a ring all-reduce sends and receives 2 (n - 1) / n of the gradients per worker a step,
        # counted as ember's allreduce counts it: once pushed, once pulled
        per_step = 2 * 2 * (world - 1) / world * parameters * world
        return json.dumps(
            {
                "test_accuracy": scores["test_accuracy"],
                "test_loss": scores["test_loss"],
                "samples": samples,
                "train_seconds": clock,
                "samples_per_second": samples / clock if clock > 0 else None,
                "seconds_per_epoch": clock / job["epochs"],
                "bytes_per_sample": per_step / (batch * world),
                "t_comp_seconds": None,  # DDP overlaps the all-reduce with the backward pass
                "t_comm_seconds": None,
                "curve": [
                    *curve,
                    [clock, samples, scores[metric]],
                ],
            }
        )
    finally:
        dist.destroy_process_group()
