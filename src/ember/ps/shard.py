"""A shard: its key range, the rule that updates it, and the state it holds with the one
commit that moves it (no sockets here). NumPy float32 arrays throughout: the server process
never imports torch."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ember.errors import ProtocolError
from ember.wire import CHUNK_BYTES

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


@dataclass
class ShardState:
    """What one shard holds (parameters, buffers, the rule's optimizer state, its step and an
    open round's clock: everything a checkpoint or a copy to the backup carries, beside the
    workers' clock table), and `commit`, the one way a push moves it. `params` and
    `rule_state` may be replaced by private copies while a reply still reads the old ones, so
    hold the ShardState, never its tensors."""

    params: np.ndarray  # this shard's keys of the flat parameter vector
    rule_state: dict[str, np.ndarray]  # the rule's per-key state, in state_names order
    round_sum: np.ndarray | None  # an open synchronous round's contributions; None if async
    round_count: int = 0  # contributions round_sum holds
    round_clock: int = 0  # the clock whose contributions round_sum holds
    step: int = 0  # commits applied to the parameters
    buffers_from: int | None = None  # the first key that holds a buffer; None: the size
    # scratch, reused by every commit: a slice's values before it, and the rule's own
    _before: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)
    _rule_scratch: np.ndarray = field(
        default_factory=lambda: np.empty(BLOCK, np.float32), repr=False, compare=False
    )

    @classmethod
    def create(
        cls,
        spec: ShardSpec,
        params: np.ndarray,
        state_names: Iterable[str],
        saved: dict[str, np.ndarray] | None,
        synchronous: bool,
        step: int,
    ) -> ShardState:
        if params.shape != (spec.size,) or params.dtype != np.float32:
            raise ValueError(
                f"shard {spec.index} wants float32[{spec.size}], "
                f"got {params.dtype}{list(params.shape)}"
            )
        rule_state = {name: np.zeros(spec.size, np.float32) for name in state_names}
        for name, value in (saved or {}).items():
            rule_state[name][:] = np.asarray(value, dtype=np.float32)
        return cls(
            params=np.array(params, dtype=np.float32, copy=True),
            rule_state=rule_state,
            round_sum=np.zeros(spec.size, np.float32) if synchronous else None,
            step=step,
            buffers_from=spec.local_buffers_from,
        )

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

    def commit(self, rule: UpdateRule, keys: slice, contribution: np.ndarray, count: int) -> bool:
        """Commit `contribution` (the sum of `count` workers') to `keys` by `rule`, unless the
        result holds NaN or Inf (then False): finite inputs can still overflow (two pushes of
        3e38). A refused commit puts back the slice's parameters and rule state. The work goes
        block by block (BLOCK keys): the copy kept for that, the rule's passes and the check, a
        sum of what was just written, all read the block from cache, so the passes NumPy cannot
        fuse cost about one trip through memory."""
        params, state = self.params[keys], self.state_at(keys)
        kept = [(value, self._scratch(name, params.size)) for name, value in state.items()]
        kept.append((params, self._scratch("params", params.size)))
        scratch, size = self._rule_scratch, params.size
        # keys from `split` on hold the model's buffers, which the rule folds in its own way
        shard_split = self.buffers_from
        split = size if shard_split is None else min(max(shard_split - keys.start, 0), size)
        for start in range(0, size, BLOCK):  # a short loop: its overhead is a few percent
            block = slice(start, start + BLOCK)
            for value, before in kept:
                np.copyto(before[block], value[block])
            written = params[block]
            stop = start + written.size
            step = self.step + 1  # this commit's number, for Adam and schedules
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
                done = start + written.size
                for value, before in kept:
                    np.copyto(value[:done], before[:done])
                return False
        return True

    def _scratch(self, name: str, size: int) -> np.ndarray:
        buffer = self._before.get(name)
        if buffer is None or buffer.size < size:
            buffer = self._before[name] = np.empty(max(size, SLICE), np.float32)
        return buffer[:size]

    def round_due(self, min_clock: int) -> bool:
        """Whether the open synchronous round has every live worker's contribution: the
        slowest clock is past the round's."""
        return self.round_sum is not None and self.round_count > 0 and min_clock > self.round_clock

    def commit_round(self, rule: UpdateRule) -> int:
        """Commit the open round and open the next; returns the slices refused. The rules are
        elementwise, so a round commits slice by slice; a slice whose result would not be
        finite keeps its parameters, and the round's sum of it is dropped."""
        assert self.round_sum is not None
        refused = 0
        with np.errstate(over="ignore", invalid="ignore"):
            for start in range(0, self.params.size, SLICE):
                keys = slice(start, start + SLICE)
                refused += not self.commit(rule, keys, self.round_sum[keys], self.round_count)
        self.step += 1
        self.round_sum.fill(0)
        self.round_count = 0
        return refused

    def move_to_private_copies(self) -> None:
        """Go on with copies of params and rule state, leaving the old tensors to their readers."""
        self.params = self.params.copy()
        self.rule_state = {name: value.copy() for name, value in self.rule_state.items()}


def header_int(
    header: dict[str, Any], key: str, minimum: int | None = None, maximum: int | None = None
) -> int:
    value = header.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProtocolError(f"header field {key!r} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ProtocolError(f"header field {key!r} must be >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ProtocolError(f"header field {key!r} must be <= {maximum}, got {value!r}")
    return value


def header_bool(header: dict[str, Any], key: str) -> bool:
    """An optional flag: absent is False."""
    value = header.get(key, False)
    if not isinstance(value, bool):
        raise ProtocolError(f"header field {key!r} must be true or false, got {value!r}")
    return value
