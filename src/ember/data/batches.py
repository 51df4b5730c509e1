"""A worker's training rows served as minibatches, a fresh order each epoch: the one seam
between the training loop and where its rows live (memory here; a stream from disk elsewhere).

imports: numpy and torch only
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Protocol

import numpy as np
import torch
from typing_extensions import Unpack  # typing's own from Python 3.11

Inputs = torch.Tensor | dict[str, torch.Tensor]
# (inputs, targets), and the rows' weights after them where the run has a weight column
Batch = tuple[Inputs, torch.Tensor, Unpack[tuple[torch.Tensor, ...]]]


class ShardBatches(Protocol):
    """What the training loop asks of a worker's rows."""

    rows: int  # training rows of this worker's shard
    batch_size: int

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """Epoch `epoch`'s batches (counted from 0) from batch `start` on, each of batch_size
        rows; the order is fixed by the run's seed, the rank and the epoch."""
        ...


class MemoryBatches:
    """A shard held in memory (a mapped one stays mapped): each epoch a permutation of its
    rows, cut into batches, the last partial batch dropped; with `weights`, each batch's
    rows' weights third."""

    def __init__(
        self,
        x: np.ndarray,
        y: np.ndarray,
        batch_size: int,
        seed: int,
        rank: int,
        weights: np.ndarray | None = None,
    ) -> None:
        # several inputs are one structured array, a field each, which torch cannot hold
        self.structured = x if x.dtype.names is not None else None
        self.features = as_tensor(x) if self.structured is None else None
        self.targets = as_tensor(y)
        self.weights = as_tensor(weights) if weights is not None else None
        self.rows, self.batch_size = len(y), batch_size
        self.seed, self.rank = seed, rank

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        rng = np.random.default_rng([self.seed, self.rank, epoch])
        order = torch.from_numpy(rng.permutation(self.rows))
        size = self.batch_size
        for index in range(start, self.rows // size):
            yield self.rows_of(order[index * size : (index + 1) * size])

    def rows_of(self, batch: torch.Tensor) -> Batch:
        """The rows numbered in `batch` as one batch, their weights third where there are."""
        # index_select copies whole rows: several times faster than advanced indexing
        if self.weights is None:
            return self.inputs(batch), self.targets.index_select(0, batch)
        inputs, targets = self.inputs(batch), self.targets.index_select(0, batch)
        return inputs, targets, self.weights.index_select(0, batch)

    def inputs(self, batch: torch.Tensor) -> Inputs:
        if self.features is not None:
            return self.features.index_select(0, batch)
        assert self.structured is not None
        return model_inputs(self.structured[batch.numpy()])


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """`array` as a tensor sharing its memory; a read-only mapping stays read only, as
    nothing writes to it."""
    array = np.ascontiguousarray(array)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        return torch.from_numpy(array)


def model_inputs(x: np.ndarray) -> Inputs:
    """Rows of inputs as the model takes them: a tensor, or a dict of tensors for a structured
    array (the model is then called with them as keyword arguments)."""
    if x.dtype.names is None:
        return as_tensor(x)
    return {name: as_tensor(np.ascontiguousarray(x[name])) for name in x.dtype.names}
