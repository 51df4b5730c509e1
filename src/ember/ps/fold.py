"""Fold: how a push's payload enters the shard, the same for a streamed and a whole payload."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ember.ps.clocks import WorkerEntry
from ember.ps.replies import Replies
from ember.ps.shard import SLICE, Shard

# Rounds a reply slice to what an encoded reply carries, in place: (first key, the slice).
Squeezer = Callable[[int, np.ndarray], None]


class Fold:
    """Contribute-then-commit over slices of the shard: asynchronously each contribution is
    committed at once; under a synchronous policy contributions sum into the open round,
    committed together once every live worker has folded into it."""

    def __init__(self, shard: Shard, replies: Replies) -> None:
        self.shard, self.replies = shard, replies
        self._payload = np.empty(SLICE, np.float32)  # a synchronous push's chunk, read once

    def chunk(
        self,
        keys: slice,
        values: np.ndarray,
        out: np.ndarray | None,
        squeeze: Squeezer | None = None,
    ) -> np.ndarray:
        """Fold one chunk of a push into `keys`, writing the rule's reply part into `out`; the
        caller has released `keys` for writing. Returns the parameters at `keys` (a view).
        With `squeeze`, the reply part is rounded as its encoding will carry it before it is
        folded, so the shard moves by exactly what the worker is told."""
        # NaN and Inf are refused by the checks below, not warned about by NumPy
        with np.errstate(over="ignore", invalid="ignore"):
            return self._chunk(keys, values, out, squeeze)

    def _chunk(
        self, keys: slice, values: np.ndarray, out: np.ndarray | None, squeeze: Squeezer | None
    ) -> np.ndarray:
        params = self.shard.params[keys]
        round_sum = self.shard.round_sum
        # Committed at once, a chunk is checked once, after its commit: the rules' results are
        # sums and scalings of their input, so NaN or Inf in it leaves them non-finite and the
        # commit is refused. A pass over the input first would only repeat that verdict.
        if round_sum is not None:
            # Read once: a payload in shared memory can change while it is folded (its worker
            # may write the region), so the check and the add must see the same values, or a
            # NaN written between them would poison the round for every worker.
            values = self._read_once(values)
            if not self._finite(values, out):
                return params
        contribution = self.shard.rule.contribute(params, values, out)
        if squeeze is not None and out is not None:
            squeeze(keys.start, out)
        if round_sum is not None:
            # Held for the round, but easgd's reply (the contribution) goes out now: refuse it
            # if finite inputs made it overflow (a pass over the chunk just written).
            if contribution is not values and not self._finite(contribution, out):
                return params
            self.shard.add_to_round(keys, contribution)
        else:
            # A refused part is a step the worker does not take: its part of the reply reads
            # zero (easgd's x_i -= e moves nothing), like an input chunk refused by _finite.
            # A streamed push's earlier chunks are already applied and answered, so the push
            # as a whole is still acknowledged; only the refused keys are left as they were.
            for part in self._commit(keys, contribution):
                if out is not None:
                    out[part].fill(0)
        return params

    def payload(
        self,
        payload: list[np.ndarray],
        worker: WorkerEntry,
        worker_step: int,
        squeeze: Squeezer | None = None,
    ) -> np.ndarray | None:
        """Fold a whole push of `worker` chunk by chunk straight from the receive buffers:
        the rules are elementwise, so no contiguous copy of the payload is ever made. Returns
        the reply (a buffer from Replies) if the rule answers pushes."""
        shard = self.shard
        out = self.replies.buffer() if shard.rule.replies else None
        if not shard.synchronous:
            self.replies.release_for_writing()
        offset = 0
        for values in payload:
            keys = slice(offset, offset + values.size)
            self.chunk(keys, values, None if out is None else out[keys], squeeze)
            offset = keys.stop
        shard.commit_push(worker, worker_step)
        return out

    def _commit(self, keys: slice, contribution: np.ndarray) -> list[slice]:
        """One push's contribution committed at once (asynchronously), counted if refused
        (in part or whole): the parts of `keys` left as they were."""
        refused = self.shard.commit(keys, contribution, 1)
        if refused:
            self.shard.rejected["nonfinite"] += 1
        return refused

    def _read_once(self, values: np.ndarray) -> np.ndarray:
        if self._payload.size < values.size:
            self._payload = np.empty(values.size, values.dtype)
        copy = self._payload[: values.size]
        np.copyto(copy, values)
        return copy

    def _finite(self, chunk: np.ndarray, out: np.ndarray | None) -> bool:
        """A chunk holding NaN or Inf contributes nothing (its reply part is zero) and is
        counted, so one diverged worker cannot poison the shared parameters. The sum is a cheap
        test (a pass at memory speed); it also refuses values so large their sum overflows."""
        if np.isfinite(chunk.sum()):
            return True
        self.shard.rejected["nonfinite"] += 1
        if out is not None:
            out.fill(0)
        return False

    def maybe_commit_round(self) -> None:
        """Commit the open synchronous round once every live worker has folded into it."""
        if self.shard.round_due():
            self.replies.release_for_writing()
            self.shard.commit_round()
