"""A run's directory, opened and closed: the data, the model's starting parameters and
--resume resolved before anything starts (never clobbering a run), and at the end the final
evaluation, summary.json and what `ember.fit` returns."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ember._version import __version__
from ember.checkpoint import (
    Checkpoint,
    latest_valid_checkpoint,
    list_checkpoints,
    load_checkpoint,
    verify_run_state,
    with_buffers,
)
from ember.config import RunConfig, RunParts
from ember.config.objects import NO_OBJECTS, UserObjects
from ember.data import Dataset
from ember.engines.modelwork import InProcess, ModelWork
from ember.engines.servers import ServerGroup
from ember.errors import CheckpointError, ConfigError
from ember.metrics import MetricsLog, write_json
from ember.metrics.records import RunEvent, RunSummary
from ember.wire import use_encryption
from ember.worker.spec import Layout, UserLoop, load_data

if TYPE_CHECKING:
    import torch


@dataclass
class RunResult:
    """What `ember.fit` returns: the summary written to summary.json and the trained model
    (built when first asked for: the launcher of a local run does not import torch)."""

    summary: dict[str, Any]
    run_dir: Path
    config: RunConfig = field(repr=False)
    shape: tuple[tuple[int, ...], int] = field(repr=False)  # the model's input shape, classes
    params: np.ndarray = field(repr=False, compare=False)  # the final state, flat
    objects: UserObjects = field(default=NO_OBJECTS, repr=False)  # a model object among them

    @cached_property
    def model(self) -> torch.nn.Module:
        """The module the summary's test figures were measured on, as model.safetensors
        holds it (parameters and buffers), in eval mode."""
        from ember.export import load_model
        from ember.models import build_model

        config = self.config  # a name, a factory or an object ember.fit was handed
        source = self.objects.model_for(config.model)
        model = build_model(config.model, *self.shape, config.seed, probe=None, source=source)
        return load_model(self.run_dir, model)


@dataclass
class RunSetup:
    config: RunConfig
    run_dir: Path
    dataset: Dataset
    initial: np.ndarray  # flat starting state (fresh, or the checkpoint's)
    layout: Layout  # which of its keys are parameters and which buffers
    resume: Checkpoint | None
    metrics: MetricsLog
    work: ModelWork  # who builds and evaluates the model
    spare_servers: list[Any] = field(default_factory=list)  # started early; ServerGroup takes them
    secret: bytes = field(default_factory=lambda: os.urandom(32))  # proves membership of the run
    loop: UserLoop | None = None  # ember.run: the function the workers run instead of ember's
    objects: UserObjects = NO_OBJECTS  # what the run was handed in place of names
    parts: RunParts = field(init=False)  # the config parsed once into what each layer reads

    def __post_init__(self) -> None:
        self.parts = RunParts.of(self.config)

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"

    def server_group(self) -> ServerGroup:
        """This run's parameter servers, not started yet."""
        logs = self.run_dir / "logs"
        spares = self.spare_servers
        return ServerGroup(
            self.parts, self.initial, self.secret, logs, self.resume, spares, self.layout
        )

    @property
    def shape(self) -> tuple[tuple[int, ...], int]:
        """The model's input shape and classes."""
        return (tuple(self.dataset.input_shape), self.dataset.num_classes)

    @property
    def resumed_step(self) -> int:
        return int(self.resume.meta.get("step", 0)) if self.resume is not None else 0


def claim_run_dir(config: RunConfig, base: Path) -> Path:
    """The run's directory: --out, else `base` (runs/<second>-<strategy>-<pid>) made here, or -2,
    -3, ... after it when that one exists already: two runs one process starts in a second
    (threads, Spark ML tuning's parallel fits) never share a directory."""
    if config.out:
        return base
    for count in range(1, 1000):
        claimed = base if count == 1 else base.with_name(f"{base.name}-{count}")
        try:
            claimed.mkdir(parents=True)  # atomic: exactly one run makes it
            return claimed
        except FileExistsError:
            continue
    raise ConfigError(f"{base.parent} holds 999 run directories named {base.name}[-N]")


def prepare_run(
    config: RunConfig, dataset: Dataset | None = None, work: ModelWork | None = None
) -> RunSetup:
    """Load data (unless given, e.g. a DataFrame's test rows) and model, resolve --resume, and
    open the run directory (never clobbering one)."""
    # the launcher's connections to its servers and collector
    use_encryption(config.encrypt, config.wire_cipher)
    dataset = dataset if dataset is not None else load_data(config)
    work = work if work is not None else InProcess()
    run_dir = config.run_dir()
    checkpoints = run_dir / "checkpoints"
    resume = resolve_resume(config, checkpoints)
    if resume is None and list_checkpoints(checkpoints):
        raise ConfigError(
            f"out {run_dir} already holds checkpoints; pass --resume auto to continue"
            " that run or choose another --out"
        )
    initial, parameters = work.initial(config, dataset)
    layout = Layout(parameters, initial.size - parameters)
    if resume is not None:
        resume = with_buffers(resume, initial, parameters)
        initial = resume.tensors["params"].astype(np.float32, copy=False)
    run_dir = claim_run_dir(config, run_dir)  # once the model is built: a failed start makes none
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    metrics = MetricsLog(run_dir / "metrics.jsonl", tensorboard=config.tensorboard)
    checkpoint = str(resume.path) if resume else None
    details = {"checkpoint": checkpoint, "config": config.to_dict()}
    metrics.write(RunEvent(event="resume" if resume else "start", details=details))
    return RunSetup(config, run_dir, dataset, initial, layout, resume, metrics, work)


def resolve_resume(config: RunConfig, checkpoints: Path) -> Checkpoint | None:
    if config.resume is None:
        return None
    if config.resume == "auto":
        found = latest_valid_checkpoint(checkpoints, verify_run_state)
        if found is None and (corrupt := list_checkpoints(checkpoints)):
            names = ", ".join(p.name for p in corrupt)
            raise CheckpointError(
                f"--resume auto: every checkpoint in {checkpoints} is corrupt ({names});"
                " pass --resume PATH to see why, or choose another --out"
            )
        return found
    path = Path(config.resume)
    if not path.exists():
        raise ConfigError(f"resume must be 'auto' or an existing checkpoint path; got {path}")
    return verify_run_state(load_checkpoint(path))


def finish_run(
    setup: RunSetup,
    params: np.ndarray,
    workers: list[dict[str, Any]],
    seconds: float,
    extra: dict[str, Any],
    history: list[Mapping[str, float]] | None = None,
) -> RunResult:
    """Write the final model (model.safetensors, model.json), evaluate that module on the
    held-out set and write summary.json; `history`, worker 0's evaluations in order, says
    whether the final model collapsed from what they saw."""
    from ember.metrics import collapse, count_dealt_rows, summarize_workers

    config, dataset = setup.config, setup.dataset
    scores = setup.work.evaluate(config, dataset, params, setup.run_dir)
    collapsed = collapse(history or [], scores, dataset.num_classes)
    if collapsed is not None:
        print(f"ember: warning: {collapsed['said']}", file=sys.stderr, flush=True)
    summary = {
        **run_facts(config),
        "model": config.model,
        "data": config.data,
        "parameters": setup.layout.parameters,
        "buffers": setup.layout.buffers,  # values of BatchNorm statistics and other buffers
        "model_file": "model.safetensors",
        "loss": config.loss,
        **scores,  # test_loss and test_<metric> each
        **summarize_workers(workers, seconds),
        "collapsed": collapsed is not None,
        **({"collapse": collapsed} if collapsed is not None else {}),
        "resumed_from": str(setup.resume.path) if setup.resume else None,
        "ember_version": __version__,
        **extra,
        "config": config.to_dict(),
    }
    count_dealt_rows(summary)
    write_json(setup.run_dir / "summary.json", summary)
    setup.metrics.write(RunSummary(scores=scores))
    setup.metrics.close()
    # not the dataset: a local run's is a mapping of files the run removes, kept alive by it
    shape = (tuple(dataset.input_shape), dataset.num_classes)
    return RunResult(summary, setup.run_dir, config, shape, params, setup.objects)


def run_facts(config: RunConfig) -> dict[str, Any]:
    """What summary.json says first of every run: how it was run."""
    return {
        "strategy": config.strategy,
        "engine": config.engine,
        "workers": config.workers,
        # the worker range (MIN = MAX for a fixed run), and joins and leaves as the servers
        # counted them (_merge_server_stats)
        "workers_min": config.workers,
        "workers_max": config.workers_max or config.workers,
        "servers": config.servers if config.uses_server else 0,
        "epochs": config.epochs,
        "precision": config.precision,
        "device": config.device,  # as asked; devices: what each worker took
    }
