"""The local PyTorch training loop of one worker, the same on every engine."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.numpy
import torch
import torch.nn.functional as F

from ember.algorithms import (
    FlatModel,
    WorkerContext,
    local_optimizer,
    make_algorithm,
    ships_gradients,
    uses_local_optimizer,
)
from ember.checkpoint import free_step, save_checkpoint
from ember.config import RunConfig
from ember.data import Dataset, load_dataset, shard_indices
from ember.metrics import Evaluation, WorkerDone, WorkerProgress, WorkerStart
from ember.models import build_model

Report = Callable[[dict[str, Any]], None]


@dataclass
class WorkerSpec:
    """Everything one worker process needs; built by an engine, handed to its child."""

    config: RunConfig
    rank: int
    world: int
    servers: list[str] = field(default_factory=list)
    secret: bytes = b""
    rendezvous: str = ""
    run_dir: str = "."
    incarnation: int = 0
    initial: np.ndarray | None = None  # starting parameters for strategies without a server
    initial_file: str | None = None  # or a safetensors file holding them as "params"
    initial_step: int = 0  # and the step they were saved at
    own_rows: bool = False  # the dataset's training rows are this worker's alone (a partition)


def load_data(config: RunConfig) -> Dataset:
    return load_dataset(
        config.data,
        seed=config.seed,
        synthetic_samples=config.synthetic_samples,
        synthetic_features=config.synthetic_features,
    )


def make_model(config: RunConfig, dataset: Dataset) -> torch.nn.Module:
    return build_model(config.model, dataset.input_shape, dataset.num_classes, seed=config.seed)


def evaluates_after(step: int, steps_per_epoch: int, eval_every: int) -> bool:
    """Whether worker 0 evaluates after `step` (counted from 0): at each epoch's end, and
    every `eval_every` steps if set."""
    periodic = eval_every > 0 and (step + 1) % eval_every == 0
    return (step + 1) % steps_per_epoch == 0 or periodic


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, x: np.ndarray, y: np.ndarray, batch: int = 2000
) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of `model` on a held-out set."""
    model.eval()
    correct, loss = 0, 0.0
    for start in range(0, len(x), batch):
        inputs = torch.from_numpy(x[start : start + batch])
        labels = torch.from_numpy(y[start : start + batch])
        logits = model(inputs)
        loss += float(F.cross_entropy(logits, labels, reduction="sum"))
        correct += int((logits.argmax(dim=1) == labels).sum())
    model.train()
    return correct / max(1, len(x)), loss / max(1, len(x))


def run_worker(
    spec: WorkerSpec,
    report: Report,
    dataset: Dataset | None = None,
    stop: threading.Event | None = None,
) -> dict[str, Any]:
    """Train this worker's shard for the configured epochs, or until `stop` is set; leave the
    servers cleanly either way and return its totals."""
    config = spec.config
    torch.set_num_threads(config.threads)
    dataset = dataset or load_data(config)
    rows = (
        np.arange(len(dataset.x_train), dtype=np.int64)
        if spec.own_rows
        else shard_indices(len(dataset.x_train), spec.rank, spec.world)
    )
    features = torch.from_numpy(np.ascontiguousarray(dataset.x_train[rows]))
    labels = torch.from_numpy(np.ascontiguousarray(dataset.y_train[rows]))
    steps_per_epoch = len(rows) // config.batch_size
    if steps_per_epoch == 0:
        raise ValueError(
            f"worker {spec.rank}: shard of {len(rows)} rows is smaller than one "
            f"batch of {config.batch_size}"
        )
    model = make_model(config, dataset)
    flat = FlatModel(model, flat_grads=ships_gradients(config))
    if spec.initial is not None:
        flat.load(spec.initial)
    elif spec.initial_file is not None:
        flat.load(safetensors.numpy.load_file(spec.initial_file)["params"])
    optimizer = local_optimizer(flat, config) if uses_local_optimizer(config) else None
    context = WorkerContext(
        config, spec.rank, spec.world, spec.servers, spec.secret, spec.incarnation, spec.rendezvous
    )
    algorithm = make_algorithm(context)
    first_step = max(algorithm.start(flat, optimizer), spec.initial_step)
    total_steps = config.epochs * steps_per_epoch
    report(
        WorkerStart(
            rank=spec.rank,
            incarnation=spec.incarnation,
            first_step=first_step,
            total_steps=total_steps,
        ).to_json()
    )

    started = last_log = time.perf_counter()
    last_checkpoint, t_comp, loss_sum, logged_steps = started, 0.0, torch.zeros(()), 0
    aside = 0.0  # seconds of evaluation and checkpointing inside the loop, not training
    saved_step = first_step
    order = torch.empty(0, dtype=torch.int64)
    last_step = total_steps
    for step in range(first_step, total_steps):
        if stop is not None and stop.is_set():
            last_step = step
            break
        epoch, index = divmod(step, steps_per_epoch)
        if index == 0 or step == first_step:  # a fresh shuffle per epoch, fixed by the seed
            rng = np.random.default_rng([config.seed, spec.rank, epoch])
            order = torch.from_numpy(rng.permutation(len(rows)))
        batch = order[index * config.batch_size : (index + 1) * config.batch_size]
        step_started, waited_before = time.perf_counter(), algorithm.stats.t_wait
        flat.zero_grad()
        # index_select copies whole rows: several times faster than advanced indexing here.
        inputs, targets = features.index_select(0, batch), labels.index_select(0, batch)
        loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        algorithm.after_backward(step)
        t_comp += time.perf_counter() - step_started - (algorithm.stats.t_wait - waited_before)
        loss_sum += loss.detach()
        logged_steps += 1
        if (step + 1) % config.log_every == 0 or step + 1 == total_steps:
            now = time.perf_counter()
            report(
                WorkerProgress(
                    rank=spec.rank,
                    incarnation=spec.incarnation,
                    step=step + 1,
                    epoch=epoch + 1,
                    loss=float(loss_sum) / logged_steps,
                    samples=(step + 1 - first_step) * config.batch_size,
                    samples_per_second=logged_steps * config.batch_size / (now - last_log),
                    t_comp=t_comp,
                    comm=algorithm.stats.as_record(),
                ).to_json()
            )
            last_log, loss_sum, logged_steps = now, torch.zeros(()), 0
        if spec.rank == 0 and evaluates_after(step, steps_per_epoch, config.eval_every):
            aside_started = time.perf_counter()
            accuracy, test_loss = evaluate(model, dataset.x_test, dataset.y_test)
            report(
                Evaluation(
                    epoch=epoch + 1,
                    step=step + 1,
                    # training so far, for time and samples to a target: the loop's seconds
                    # without evaluation and checkpoints, and every worker's samples alike
                    seconds=aside_started - started - aside,
                    samples=(step + 1 - first_step) * config.batch_size * spec.world,
                    test_accuracy=accuracy,
                    test_loss=test_loss,
                ).to_json()
            )
            aside += time.perf_counter() - aside_started
        if (
            not config.uses_server
            and spec.rank == 0
            and (
                time.perf_counter() - last_checkpoint > config.checkpoint_seconds
                or (config.checkpoint_steps and step + 1 - saved_step >= config.checkpoint_steps)
            )
        ):
            aside_started = time.perf_counter()
            _save_local(spec, flat, step + 1)
            last_checkpoint, saved_step = time.perf_counter(), step + 1
            aside += last_checkpoint - aside_started
    algorithm.finish()
    seconds = time.perf_counter() - started - aside
    if not config.uses_server and spec.rank == 0 and saved_step != last_step:
        _save_local(spec, flat, last_step)
    stats = algorithm.stats
    steps_run = last_step - first_step
    return WorkerDone(
        rank=spec.rank,
        incarnation=spec.incarnation,
        steps=steps_run,
        samples=steps_run * config.batch_size,
        seconds=seconds,
        aside_seconds=aside,
        t_comp=t_comp,
        comm=stats.as_record(),
    ).to_json()


def _save_local(spec: WorkerSpec, flat: FlatModel, step: int) -> None:
    """Strategies without a server checkpoint worker 0's parameters (all workers agree)."""
    root = Path(spec.run_dir) / "checkpoints"
    save_checkpoint(
        root,
        free_step(root, step),  # never collides with checkpoints a fallen-back resume left
        {"params": flat.params_np.copy()},
        checkpoint_meta(spec.config, flat.size, step),
        keep=spec.config.keep_checkpoints,
    )


def checkpoint_meta(config: RunConfig, size: int, step: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": config.model,
        "data": config.data,
        "strategy": config.strategy,
        "parameters": size,
        "step": step,
        "config": config.to_dict(),
        **extra,
    }
