"""Fold: how a push's payload enters the shard, the same for a streamed and a whole payload."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import numpy as np

from ember.ps.clocks import ClockTable
from ember.ps.replies import Replies
from ember.ps.shard import ShardState, UpdateRule
from ember.wire import CHUNK_BYTES

SLICE = CHUNK_BYTES // 4  # keys a round commits (and checks) at a time: one payload chunk's worth
BLOCK = 1 << 16  # keys a commit works on at a time: its arrays' blocks fit in a core's L2 cache
# Rounds a reply slice to what an encoded reply carries, in place: (first key, the slice).
Squeezer = Callable[[int, np.ndarray], None]


class Fold:
    """Contribute-then-commit over slices of the shard: asynchronously each contribution is
    committed at once; under a synchronous policy contributions sum into the open round,
    committed together once every live worker has folded into it."""

    def __init__(
        self,
        shard: ShardState,
        rule: UpdateRule,
        clocks: ClockTable,
        replies: Replies,
        counters: Counter[str],
        rejected: Counter[str],
    ) -> None:
        self.shard, self.rule, self.clocks, self.replies = shard, rule, clocks, replies
        self.counters, self.rejected = counters, rejected
        # scratch, reused by every commit: a slice's values before it, and the rule's own
        self._before: dict[str, np.ndarray] = {}
        self._rule_scratch = np.empty(BLOCK, np.float32)
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
        contribution = self.rule.contribute(params, values, out)
        if squeeze is not None and out is not None:
            squeeze(keys.start, out)
        if round_sum is not None:
            # Held for the round, but easgd's reply (the contribution) goes out now: refuse it
            # if finite inputs made it overflow (a pass over the chunk just written).
            if contribution is not values and not self._finite(contribution, out):
                return params
            # BSP folds only clock == min_clock, so a round never mixes clocks.
            round_sum_keys = round_sum[keys]  # an overflow here is refused at the round's commit
            np.add(round_sum_keys, contribution, out=round_sum_keys)
        elif not self._commit(keys, contribution, 1) and out is not None:
            # A refused chunk is a step the worker does not take: its part of the reply reads
            # zero (easgd's x_i -= e moves nothing), like an input chunk refused by _finite.
            # A streamed push's earlier chunks are already applied and answered, so the push
            # as a whole is still acknowledged; only this chunk's keys are left as they were.
            out.fill(0)
        return params

    def payload(
        self, payload: list[np.ndarray], clock: int, squeeze: Squeezer | None = None
    ) -> np.ndarray | None:
        """Fold a whole push chunk by chunk straight from the receive buffers: the rules are
        elementwise, so no contiguous copy of the payload is ever made. Returns the reply
        (a buffer from Replies) if the rule answers pushes."""
        out = self.replies.buffer() if self.rule.replies else None
        shard = self.shard
        synchronous = shard.round_sum is not None
        if not synchronous:
            self.replies.release_for_writing()
        offset = 0
        for values in payload:
            keys = slice(offset, offset + values.size)
            self.chunk(keys, values, None if out is None else out[keys], squeeze)
            offset = keys.stop
        self.counters["pushes"] += 1
        if synchronous:
            shard.round_count, shard.round_clock = shard.round_count + 1, clock
        else:
            shard.step += 1
        return out

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
        self.rejected["nonfinite"] += 1
        if out is not None:
            out.fill(0)
        return False

    def _commit(self, keys: slice, contribution: np.ndarray, count: int) -> bool:
        """Commit `contribution` to `keys` unless the result holds NaN or Inf: finite inputs can
        still overflow (two pushes of 3e38). A refused commit puts back the slice's parameters
        and rule state. The work goes block by block (BLOCK keys): the copy kept for that, the
        rule's passes and the check, a sum of what was just written, all read the block from
        cache, so the passes NumPy cannot fuse cost about one trip through memory."""
        params, state = self.shard.params[keys], self.shard.state_at(keys)
        kept = [(value, self._scratch(name, params.size)) for name, value in state.items()]
        kept.append((params, self._scratch("params", params.size)))
        scratch, size = self._rule_scratch, params.size
        # keys from `split` on hold the model's buffers, which the rule folds in its own way
        shard_split = self.shard.buffers_from
        split = size if shard_split is None else min(max(shard_split - keys.start, 0), size)
        for start in range(0, size, BLOCK):  # a short loop: its overhead is a few percent
            block = slice(start, start + BLOCK)
            for value, before in kept:
                np.copyto(before[block], value[block])
            written = params[block]
            stop = start + written.size
            step = self.shard.step + 1  # this commit's number, for Adam and schedules
            for part, buffers in (
                (slice(start, min(stop, split)), False),
                (slice(max(start, split), stop), True),
            ):
                if part.start >= part.stop:
                    continue
                values = params[part]
                rule_state = {name: value[part] for name, value in state.items()}
                args = (values, rule_state, contribution[part], count, scratch[: values.size])
                if buffers:
                    self.rule.commit_buffers(*args)
                else:
                    self.rule.commit(*args, step=step)
            if not math.isfinite(written.sum()):
                done = start + written.size
                for value, before in kept:
                    np.copyto(value[:done], before[:done])
                self.rejected["nonfinite"] += 1
                return False
        return True

    def _scratch(self, name: str, size: int) -> np.ndarray:
        buffer = self._before.get(name)
        if buffer is None or buffer.size < size:
            buffer = self._before[name] = np.empty(max(size, SLICE), np.float32)
        return buffer[:size]

    def maybe_commit_round(self) -> None:
        shard = self.shard
        if shard.round_sum is None or shard.round_count == 0:
            return
        if self.clocks.min_clock() > shard.round_clock:  # every live worker folded this round
            self.replies.release_for_writing()
            # The rules are elementwise, so a round commits slice by slice; a slice whose result
            # would not be finite keeps its parameters, and the round's sum of it is dropped.
            with np.errstate(over="ignore", invalid="ignore"):
                for start in range(0, shard.params.size, SLICE):
                    keys = slice(start, start + SLICE)
                    self._commit(keys, shard.round_sum[keys], shard.round_count)
            shard.step += 1
            shard.round_sum.fill(0)
            shard.round_count = 0
