"""Evaluation on a held-out set: when worker 0 evaluates, and the accuracy and mean loss of a
model, or of a flat model with other parameters in place of its own."""

from __future__ import annotations

import warnings
from collections.abc import Iterable

import numpy as np
import torch
import torch.nn.functional as F

from ember.algorithms import FlatModel


def ends_epoch(step: int, steps_per_epoch: int) -> bool:
    """Whether `step` (counted from 0) is its epoch's last."""
    return (step + 1) % steps_per_epoch == 0


def evaluates_after(step: int, steps_per_epoch: int, eval_every: int) -> bool:
    """Whether worker 0 evaluates after `step` (counted from 0): at each epoch's end, and
    every `eval_every` steps if set."""
    periodic = eval_every > 0 and (step + 1) % eval_every == 0
    return ends_epoch(step, steps_per_epoch) or periodic


def evaluate(
    model: torch.nn.Module, x: np.ndarray, y: np.ndarray, batch: int = 2000
) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of `model` on a held-out set."""
    starts = range(0, len(x), batch)
    return evaluate_batches(model, ((x[s : s + batch], y[s : s + batch]) for s in starts))


def evaluate_with(
    flat: FlatModel, params: np.ndarray, x: np.ndarray, y: np.ndarray
) -> tuple[float, float]:
    """evaluate() of flat's module with `params` in place of its own, which it has back after."""
    flat.gather_buffers()
    own = flat.params_np.copy()
    flat.params_np[:] = params
    flat.scatter_buffers()
    try:
        return evaluate(flat.module, x, y)
    finally:
        flat.params_np[:] = own
        flat.scatter_buffers()


@torch.no_grad()
def evaluate_batches(
    model: torch.nn.Module, batches: Iterable[tuple[np.ndarray, np.ndarray]]
) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of `model` over (inputs, labels) batches."""
    training = model.training  # given back as it was: a loaded model stays in eval mode
    model.eval()
    correct, loss, count = 0, 0.0, 0
    for x, y in batches:
        with warnings.catch_warnings():  # the test set may be a read-only mapping: only read
            warnings.filterwarnings("ignore", "The given NumPy array is not writable")
            inputs, labels = torch.from_numpy(x), torch.from_numpy(y)
        logits = model(inputs)
        loss += float(F.cross_entropy(logits, labels, reduction="sum"))
        correct += int((logits.argmax(dim=1) == labels).sum())
        count += len(y)
    model.train(training)
    return correct / max(1, count), loss / max(1, count)
