"""A worker's shard of the run's data, as every training function reads it (ctx.data)."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Protocol

import numpy as np
import torch

from ember.config import DataPart
from ember.data import Dataset, shard_indices
from ember.data.batches import Batch, MemoryBatches, ShardBatches
from ember.data.streamhost import StreamedDataset, counted, stream_batches
from ember.errors import EmberError
from ember.worker.pieces import MemoryPieces, PieceRows, PieceSource
from ember.worker.spec import WorkerSpec
from ember.worker.streamed import StreamedPieces


class Stepping(Protocol):
    steps: int  # steps done


class Where(Protocol):
    """What the data tells its worker context, and reads of it: the epoch and rows served,
    the step this incarnation began at, and its optimizer's steps once it has one."""

    epoch: int
    samples: int
    start_step: int

    @property
    def optimizer(self) -> Stepping | None: ...


class Held(Protocol):
    """A worker's rows as the loop counts them; their `counters` (where kept) say what
    reading them cost."""

    rows: int
    batch_size: int


class WorkerData:
    """This worker's shard of the run's data: its rows (x, y; None for rows streamed from
    disk), the held-out rows (x_test, y_test), and each epoch's minibatches in the seeded
    order every loop takes them in."""

    def __init__(self, spec: WorkerSpec, dataset: Dataset, ctx: Where) -> None:
        self.x: np.ndarray | None = None  # its training rows, unless they stay on disk
        self.y: np.ndarray | None = None
        self.w: np.ndarray | None = None  # the rows' weights, where the run has a weight column
        self.shard: Held  # its rows, as the loop counts them
        self._epochs: ShardBatches | None = None  # each epoch's batches, without a range
        self.pieces: PieceSource | None = None  # a worker range's: rows dealt by the servers
        if spec.dealt and isinstance(dataset, StreamedDataset):
            assert dataset.plan is not None  # StreamedDataset insists
            batch_size, seed = spec.parts.training.batch_size, spec.parts.data.seed
            shape = dataset.input_shape
            streamed = StreamedPieces(dataset.plan, batch_size, seed, dataset.groups, shape)
            self.pieces, self.shard = _piece_source(spec, streamed), streamed
        elif spec.dealt:
            self.x, self.y, self.w = dataset.x_train, dataset.y_train, dataset.w_train
            memory = MemoryBatches(self.x, self.y, *_seeded(spec), self.w)
            self.pieces = _piece_source(spec, MemoryPieces(memory, spec.parts.data.seed))
            self.shard = counted(memory)
        elif isinstance(dataset, StreamedDataset):
            self.shard = self._epochs = stream_batches(
                dataset, spec.rank, spec.world, *_streamed(spec)
            )
        else:
            self.x, self.y, self.w = shard_rows(spec, dataset)
            self.shard = self._epochs = _in_memory(spec, self.x, self.y, self.w)
        self.x_test, self.y_test = dataset.x_test, dataset.y_test
        self.batch_size = spec.parts.training.batch_size
        self.steps_per_epoch = self.shard.rows // self.batch_size
        if self.pieces is not None:  # a member's share, as far as the run's MIN members go
            self.steps_per_epoch = max(1, self.pieces.steps_per_epoch // spec.world)
            self.pieces.steps = self._steps_done  # said as it starts or gives back a piece
        self._ctx = ctx

    def _steps_done(self) -> int | None:
        optimizer = self._ctx.optimizer
        return optimizer.steps if optimizer is not None else None

    @property
    def between_pieces(self) -> bool:
        """Whether the batch served last ended its piece of a worker range's rows (always,
        without a range): a member told to leave goes only then, leaving no piece half done."""
        return self.pieces is None or self.pieces.between_pieces

    def batches(self, epoch: int) -> Generator[Batch, None, None]:
        """Epoch `epoch`'s (inputs, targets) minibatches, counted from 0, with the rows'
        weights third where the run has a weight column. A restarted worker resumes from the
        servers' record of its steps, so batches it trained already are skipped and the loop
        goes on where the rank stopped."""
        ctx = self._ctx
        ctx.epoch = epoch
        if self.pieces is not None:
            for (dealt_epoch, _), batch in self.pieces.epoch(epoch):
                ctx.epoch = dealt_epoch  # a piece given back from an earlier epoch says so
                ctx.samples += len(batch[1])
                yield batch
            return
        assert self._epochs is not None  # a worker without a range has its shard's batches
        start = min(max(0, ctx.start_step - epoch * self.steps_per_epoch), self.steps_per_epoch)
        for batch in self._epochs.epoch(epoch, start):
            ctx.samples += len(batch[1])
            yield batch

    def in_order(
        self, batch_size: int | None = None, samples: int | None = None
    ) -> Iterator[Batch]:
        """This worker's rows as they are stored (a Spark task's: its partition's order), in
        batches of `batch_size` (the run's by default), the last one partial: `samples` rows
        in all, the shard's start again once it runs out (so that every rank takes as many
        steps, as TorchDistributor's partition loader does), else the shard once; the rows'
        weights third where the run has a weight column."""
        if self.x is None or self.y is None:
            raise EmberError("ctx.data.in_order reads rows held in memory; these are streamed")
        size = batch_size or self.batch_size
        rows = np.arange(samples if samples is not None else len(self.y)) % len(self.y)
        for start in range(0, len(rows), size):
            chosen = rows[start : start + size]
            self._ctx.samples += len(chosen)
            x, y = torch.from_numpy(self.x[chosen]), torch.from_numpy(self.y[chosen])
            yield (x, y) if self.w is None else (x, y, torch.from_numpy(self.w[chosen]))


def shard_rows(
    spec: WorkerSpec, dataset: Dataset
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """This worker's training rows and their weights (None: the run has none), at least one
    batch of them: its own rows in place (a mapped shard stays mapped, never copied), else
    its slice of the whole set."""
    x, y, w = dataset.x_train, dataset.y_train, dataset.w_train
    if not spec.own_rows:
        rows = shard_indices(len(x), spec.rank, spec.world)
        x, y = x[rows[0] : rows[-1] + 1], y[rows[0] : rows[-1] + 1]
        w = w[rows[0] : rows[-1] + 1] if w is not None else None
    batch_size = spec.parts.training.batch_size
    if len(y) < batch_size:
        raise ValueError(
            f"worker {spec.rank}: shard of {len(y)} rows is smaller than one batch of {batch_size}"
        )
    return x, y, w


def shard_batches(spec: WorkerSpec, dataset: Dataset) -> ShardBatches:
    """This worker's training rows as batches, with the counters a stream keeps."""
    if isinstance(dataset, StreamedDataset):
        return stream_batches(dataset, spec.rank, spec.world, *_streamed(spec))
    return _in_memory(spec, *shard_rows(spec, dataset))


def _in_memory(
    spec: WorkerSpec, x: np.ndarray, y: np.ndarray, w: np.ndarray | None
) -> ShardBatches:
    """Rows held in memory as batches, with the counters a stream keeps."""
    return counted(MemoryBatches(x, y, *_seeded(spec), w))


def _seeded(spec: WorkerSpec) -> tuple[int, int, int]:
    """Batch size, seed and rank: what fixes the order of a worker's batches."""
    return spec.parts.training.batch_size, spec.parts.data.seed, spec.rank


def _piece_source(spec: WorkerSpec, rows: PieceRows) -> PieceSource:
    servers = spec.parts.servers
    return PieceSource(
        rows,
        spec.parts.training.epochs,
        spec.parts.strategy.workers_max or spec.world,
        spec.servers[0],
        spec.secret,
        (spec.rank, spec.incarnation),
        servers.request_timeout,
        # the last pieces are held elsewhere until their holder finishes, or its lease runs out
        wait_limit=4 * servers.worker_timeout + servers.request_timeout,
    )


def _streamed(spec: WorkerSpec) -> tuple[DataPart, int]:
    """What a stream of this worker's rows reads of the run: its data part and batch size."""
    return spec.parts.data, spec.parts.training.batch_size


__all__ = ["WorkerData", "shard_batches", "shard_rows"]
