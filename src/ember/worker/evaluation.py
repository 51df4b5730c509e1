"""Evaluation on a held-out set: when worker 0 evaluates, and the mean loss and metrics of a
model, or of a flat model with other parameters in place of its own."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import torch

from ember.algorithms import FlatModel
from ember.config.objective import METRICS, metric_names, targets_of
from ember.config.objects import NO_OBJECTS, UserObjects
from ember.data.batches import as_tensor, model_inputs
from ember.data.dataset import IGNORED_CLASS
from ember.models.losses import fit_to_targets, make_loss, resolve_function
from ember.models.zoo import forward
from ember.worker.device import inputs_to


def ends_epoch(step: int, steps_per_epoch: int) -> bool:
    """Whether `step` (counted from 0) is its epoch's last."""
    return (step + 1) % steps_per_epoch == 0


def evaluates_after(step: int, steps_per_epoch: int, eval_every: int) -> bool:
    """Whether worker 0 evaluates after `step` (counted from 0): at each epoch's end, and
    every `eval_every` steps if set."""
    periodic = eval_every > 0 and (step + 1) % eval_every == 0
    return ends_epoch(step, steps_per_epoch) or periodic


Scores = dict[str, float]  # "test_loss", and "test_<metric>" for each of the run's metrics


def evaluate(
    model: torch.nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    loss: str = "cross_entropy",
    metrics: str | None = None,
    objects: UserObjects = NO_OBJECTS,
    batch: int = 2000,
) -> Scores:
    """The mean loss and the metrics of `model` on a held-out set; `objects` holds a loss or
    metric the run was handed as an object."""
    starts = range(0, len(x), batch)
    batches = ((x[s : s + batch], y[s : s + batch]) for s in starts)
    return evaluate_batches(model, batches, loss, metrics, objects)


def evaluate_with(
    flat: FlatModel,
    params: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    loss: str = "cross_entropy",
    metrics: str | None = None,
    objects: UserObjects = NO_OBJECTS,
) -> Scores:
    """evaluate() of flat's module with `params` in place of its own, which it has back after."""
    flat.gather_buffers()
    own = flat.to_host().copy()
    flat.params_np[:] = params
    flat.from_host()
    flat.scatter_buffers()
    try:
        return evaluate(flat.module, x, y, loss, metrics, objects)
    finally:
        flat.params_np[:] = own
        flat.from_host()
        flat.scatter_buffers()


@torch.no_grad()
def evaluate_batches(
    model: torch.nn.Module,
    batches: Iterable[tuple[np.ndarray, np.ndarray]],
    loss: str = "cross_entropy",
    metrics: str | None = None,
    objects: UserObjects = NO_OBJECTS,
) -> Scores:
    """The mean loss and the metrics of `model` over (inputs, targets) batches."""
    training = model.training  # given back as it was: a loaded model stays in eval mode
    model.eval()
    tally = Tally(loss, metric_names(loss, metrics), objects, infer=metrics is None)
    device = next(model.parameters(), torch.empty(0)).device
    for x, y in batches:
        outputs = forward(model, inputs_to(model_inputs(x), device)).float()
        tally.add(outputs if device.type == "cpu" else outputs.cpu(), as_tensor(y))
    model.train(training)
    return tally.scores()


class Tally:
    """Sums over a held-out set's batches from which its loss and metrics follow: the loss
    and each user metric weighted by the batch's rows, accuracy over the counted targets
    (a per-token target of -100 is not), RMSE, MAE and R^2 over every target value. With
    `infer`, a user's loss given no metrics is judged by accuracy too where its first batch
    says it classifies: integer targets, and an output with a score per class besides."""

    def __init__(
        self,
        loss: str,
        metrics: tuple[str, ...],
        objects: UserObjects = NO_OBJECTS,
        infer: bool = False,
    ) -> None:
        self.loss, self.kind, self.metrics = make_loss(loss, objects), targets_of(loss), metrics
        self.infer = infer and self.kind is None  # a named loss says its own metrics
        self.functions = {
            name: resolve_function(name, "metric", objects)
            for name in metrics
            if name not in METRICS
        }
        self.sums: dict[str, float] = dict.fromkeys(
            ("rows", "loss", "correct", "counted", "squares", "absolute", "y", "y2", "values"),
            0.0,
        )
        self.user: dict[str, float] = dict.fromkeys(self.functions, 0.0)

    def add(self, output: torch.Tensor, target: torch.Tensor) -> None:
        if self.infer:
            self.infer = False
            if classifies(output, target):
                self.metrics = (*self.metrics, "accuracy")
        sums, rows = self.sums, len(target)
        sums["rows"] += rows
        sums["loss"] += float(self.loss(output, target)) * rows
        for name, function in self.functions.items():
            self.user[name] += float(function(output, target)) * rows
        if "accuracy" in self.metrics:
            self._add_correct(output, target)
        if {"rmse", "mae", "r2"} & set(self.metrics):
            output, target = fit_to_targets("values", output, target)
            error = (output - target).double()
            target = target.double()
            sums["squares"] += float((error * error).sum())
            sums["absolute"] += float(error.abs().sum())
            sums["y"] += float(target.sum())
            sums["y2"] += float((target * target).sum())
            sums["values"] += target.numel()

    def _add_correct(self, output: torch.Tensor, target: torch.Tensor) -> None:
        if self.kind == "binary":
            output, target = fit_to_targets("binary", output, target)
            right, counted = (
                (output > 0) == (target > 0.5),
                torch.ones_like(target, dtype=torch.bool),
            )
        else:
            counted = target != IGNORED_CLASS
            right = (output.argmax(dim=-1) == target) & counted
        self.sums["correct"] += int(right.sum())
        self.sums["counted"] += int(counted.sum())

    def scores(self) -> Scores:
        sums, rows = self.sums, max(1.0, self.sums["rows"])
        values = max(1.0, sums["values"])
        found = {
            "accuracy": sums["correct"] / max(1.0, sums["counted"]),
            "rmse": math.sqrt(sums["squares"] / values),
            "mae": sums["absolute"] / values,
            # 1 - residual / total sum of squares, the total about the targets' own mean
            "r2": 1 - sums["squares"] / max(1e-12, sums["y2"] - sums["y"] ** 2 / values),
        }
        scores = {
            metric_key(name): found[name] if name in found else self.user[name] / rows
            for name in self.metrics
        }
        return {**scores, "test_loss": sums["loss"] / rows}


def classifies(output: torch.Tensor, target: torch.Tensor) -> bool:
    """Whether a model's output and its targets are a classifier's: integer class targets
    (one a row, or one a token) and a score for each of two or more classes."""
    integer = not target.is_floating_point() and target.dtype != torch.bool
    return integer and output.dim() == target.dim() + 1 and output.shape[-1] >= 2


def metric_key(name: str) -> str:
    """The summary's key for a metric: test_rmse, or test_<function> for a user's."""
    return "test_" + name.replace(":", ".").rsplit(".", 1)[-1]
