"""A shard: its key range, the rule that updates it, and the Shard, which holds its state
and is the only writer of it (no sockets here). NumPy float32 arrays throughout: the server process
never imports torch."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ember.ps.clocks import ClockTable, WorkerEntry
from ember.wire import CHUNK_BYTES, gather

SLICE = CHUNK_BYTES // 4  # keys a round commits (and checks) at a time: one payload chunk's worth
BLOCK = 1 << 16  # keys a commit works on at a time: its arrays' blocks fit in a core's L2 cache
ALL_KEYS = slice(0, 1 << 62)  # a reply or snapshot that reads every key of the shard
# A worker's step, its resume point: beyond any run, exact as a float64 in a checkpoint's JSON,
# and far inside the clock table's int64 columns.
MAX_STEP = 1 << 53


class UpdateRule(Protocol):
    """How pushes fold into the shard. Algorithms implement it; the server never imports them."""

    @property
    def name(self) -> str: ...

    @property
    def replies(self) -> bool:
        """Whether a push is answered with the tensor `contribute` wrote into `out`."""
        ...

    @property
    def state_names(self) -> tuple[str, ...]:
        """Per-key state the rule keeps beside the parameters (saved in checkpoints)."""
        ...

    def contribute(
        self, params: np.ndarray, payload: np.ndarray, out: np.ndarray | None
    ) -> np.ndarray:
        """What this push adds to the round (it may alias `payload` or `out`; `payload` may
        be a read-only view of a receive buffer)."""
        ...

    def commit(
        self,
        params: np.ndarray,
        state: dict[str, np.ndarray],
        folded: np.ndarray,
        count: int,
        scratch: np.ndarray,
        step: int = 1,
    ) -> None:
        """Apply the sum of `count` contributions to the parameters in place; `scratch`, of
        `folded`'s size, is the rule's to overwrite, so an update allocates nothing. `step`
        counts the shard's commits from 1 (this one included): Adam's bias correction and
        the learning-rate schedule follow it."""
        ...

    def commit_buffers(
        self,
        buffers: np.ndarray,
        state: dict[str, np.ndarray],
        folded: np.ndarray,
        count: int,
        scratch: np.ndarray,
    ) -> None:
        """`commit` for the model's buffer keys (BatchNorm's statistics), which pushes carry
        as values, not as what the rule makes of parameters."""
        ...


@dataclass(frozen=True)
class ShardSpec:
    index: int  # which shard of `count`
    count: int
    start: int  # first key (element of the flat parameter vector) this shard owns
    stop: int
    buffers_from: int | None = None  # first key of the model's buffers; None: all parameters

    @property
    def size(self) -> int:
        return self.stop - self.start

    @property
    def local_buffers_from(self) -> int:
        """The first of this shard's own keys that holds a buffer (its size if none does)."""
        if self.buffers_from is None:
            return self.size
        return min(max(self.buffers_from - self.start, 0), self.size)


def shard_ranges(total: int, count: int) -> list[tuple[int, int]]:
    """Split [0, total) into `count` contiguous ranges whose sizes differ by at most one."""
    bounds = [total * i // count for i in range(count + 1)]
    return list(itertools.pairwise(bounds))


class Shard:
    """One shard's whole state: its parameters and buffers, the rule's per-key state, its
    step, an open synchronous round, and its workers' clock table (membership); and its
    counters. Its methods are the only writers of that state: `commit_push` when a push is
    folded, `commit_round` when a round closes, `restore` when a copy from the primary
    arrives; `commit` and `add_to_round` move a slice of keys. `params` and `rule_state` may
    be replaced by private copies while a reply still reads the old ones, so hold the
    Shard, never its tensors."""

    def __init__(
        self,
        spec: ShardSpec,
        params: np.ndarray,
        rule: UpdateRule,
        clocks: ClockTable,
        *,
        synchronous: bool,
        saved: dict[str, np.ndarray] | None = None,
        step: int = 0,
    ) -> None:
        if params.shape != (spec.size,) or params.dtype != np.float32:
            raise ValueError(
                f"shard {spec.index} wants float32[{spec.size}], "
                f"got {params.dtype}{list(params.shape)}"
            )
        self.spec, self.rule, self.clocks = spec, rule, clocks
        self.params = np.array(params, dtype=np.float32, copy=True)
        self.rule_state = {name: np.zeros(spec.size, np.float32) for name in rule.state_names}
        for name, value in (saved or {}).items():
            self.rule_state[name][:] = np.asarray(value, dtype=np.float32)
        # an open synchronous round: the contributions of round_count workers at round_clock
        self.round_sum = np.zeros(spec.size, np.float32) if synchronous else None
        self.round_count, self.round_clock = 0, 0
        self.step = step  # commits applied to the parameters
        self._buffers_from = spec.local_buffers_from  # keys from here on hold the model's buffers
        self.counters: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()  # requests and slices refused, by reason
        # scratch, reused by every commit: a slice's values before it, and the rule's own
        self._before: dict[str, np.ndarray] = {}
        self._rule_scratch = np.empty(BLOCK, np.float32)

    @property
    def synchronous(self) -> bool:
        return self.round_sum is not None

    # ---- reading -------------------------------------------------------------------------------
    def state_at(self, keys: slice) -> dict[str, np.ndarray]:
        """The rule's state for `keys`, as views."""
        return {name: value[keys] for name, value in self.rule_state.items()}

    def saved(self) -> dict[str, np.ndarray]:
        """The parameters and the rule's state, as a snapshot names them."""
        return {"params": self.params, **self.rule_state}

    def copied(self) -> dict[str, np.ndarray]:
        """What a copy to the backup carries: the snapshot's tensors and an open round's sum."""
        tensors = self.saved()
        if self.round_sum is not None:
            tensors["round_sum"] = self.round_sum
        return tensors

    def snapshot(self) -> ShardCopy:
        """A copy of everything a backup needs to serve from, the caller's to send."""
        tensors = {name: value.copy() for name, value in self.copied().items()}
        round_ = (self.round_count, self.round_clock)
        return ShardCopy(tensors, self.step, round_, self.clocks.rows())

    def round_due(self) -> bool:
        """Whether the open synchronous round has every live worker's contribution: the
        slowest clock is past the round's."""
        return (
            self.round_sum is not None
            and self.round_count > 0
            and self.clocks.min_clock() > self.round_clock
        )

    # ---- writing -------------------------------------------------------------------------------
    def commit_push(self, worker: WorkerEntry, worker_step: int) -> None:
        """A push of `worker`, whose own step is `worker_step`, is folded whole: its clock
        moves on; asynchronously the shard's step does, synchronously the open round counts
        it (a round never mixes clocks: only the slowest clock's pushes are folded)."""
        if self.round_sum is not None:
            self.round_count, self.round_clock = self.round_count + 1, worker.clock
        else:
            self.step += 1
        worker.clock += 1
        worker.step = worker_step  # recorded when folded: a checkpoint never skips it
        self.counters["pushes"] += 1

    def add_to_round(self, keys: slice, contribution: np.ndarray) -> None:
        """A synchronous push's contribution to `keys`, held for the round's commit (an
        overflow here is refused there)."""
        assert self.round_sum is not None
        held = self.round_sum[keys]
        np.add(held, contribution, out=held)

    def commit(self, keys: slice, contribution: np.ndarray, count: int) -> list[slice]:
        """Commit `contribution` (the sum of `count` workers') to `keys` by the rule, block by
        block (BLOCK keys); returns the blocks (as offsets into `keys`) left as they were: a
        block whose result holds NaN or Inf (a NaN or Inf in its input, or finite inputs
        that overflow, as two pushes of 3e38 do) gets its parameters and rule state put
        back, and the others are committed. The copy kept of the block, the rule's passes
        and the check, a sum of what was just written, all read the block from cache, so the
        passes NumPy cannot fuse cost about one trip through memory, and the kept copy never
        leaves the cache (a copy of the whole slice, to put it all back, cost the exchange
        through shared memory about a sixth of its rate)."""
        rule, params, state = self.rule, self.params[keys], self.state_at(keys)
        scratch, size = self._rule_scratch, params.size
        kept = [(value, self._scratch(name, BLOCK)) for name, value in state.items()]
        kept.append((params, self._scratch("params", BLOCK)))
        refused: list[slice] = []
        # keys from `split` on hold the model's buffers, which the rule folds in its own way
        split = min(max(self._buffers_from - keys.start, 0), size)
        step = self.step + 1  # this commit's number, for Adam and schedules
        for start in range(0, size, BLOCK):  # a short loop: its overhead is a few percent
            block = slice(start, start + BLOCK)
            written = params[block]
            stop = start + written.size
            for value, before in kept:
                np.copyto(before[: written.size], value[block])
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
                    rule.commit_buffers(*args)
                else:
                    rule.commit(*args, step=step)
            if not math.isfinite(written.sum()):
                for value, before in kept:
                    np.copyto(value[block], before[: written.size])
                refused.append(slice(start, stop))
        return refused

    def _scratch(self, name: str, size: int) -> np.ndarray:
        buffer = self._before.get(name)
        if buffer is None or buffer.size < size:
            buffer = self._before[name] = np.empty(size, np.float32)
        return buffer[:size]

    def commit_round(self) -> None:
        """Commit the open round and open the next. The rules are elementwise, so a round
        commits slice by slice; a slice whose result would not be finite keeps its
        parameters, and the round's sum of it is dropped (counted as refused)."""
        assert self.round_sum is not None
        with np.errstate(over="ignore", invalid="ignore"):
            for start in range(0, self.params.size, SLICE):
                keys = slice(start, start + SLICE)
                if self.commit(keys, self.round_sum[keys], self.round_count):
                    self.rejected["nonfinite"] += 1
        self.step += 1
        self.round_sum.fill(0)
        self.round_count = 0

    def restore(
        self, chunks: dict[str, list[np.ndarray]], step: int, round_: tuple[int, int], rows: object
    ) -> None:
        """Take a copy from the primary (`snapshot`'s parts as received, each tensor as its
        chunks): every clock row is checked before anything is replaced."""
        self.clocks.restore(rows)
        targets = self.copied()
        for name, parts in chunks.items():
            gather(parts, targets[name])
        self.step = step
        self.round_count, self.round_clock = round_

    def move_to_private_copies(self) -> None:
        """Go on with copies of params and rule state, leaving the old tensors to their readers."""
        self.params = self.params.copy()
        self.rule_state = {name: value.copy() for name, value in self.rule_state.items()}


@dataclass(frozen=True)
class ShardCopy:
    """What a primary ships its backup (Shard.snapshot): tensors by name, the step, the open
    round as (count, clock), and the clock table's rows."""

    tensors: dict[str, np.ndarray]
    step: int
    round: tuple[int, int]
    rows: np.ndarray
