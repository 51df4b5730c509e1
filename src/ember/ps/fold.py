"""Fold: how a push's payload enters the shard, the same for a streamed and a whole payload."""

from __future__ import annotations

from collections import Counter

import torch

from ember.ps.clocks import ClockTable
from ember.ps.replies import Replies
from ember.ps.shard import ShardState, UpdateRule


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

    def chunk(self, keys: slice, values: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        """Fold one chunk of a push into `keys`, writing the rule's reply part into `out`; the
        caller has released `keys` for writing. Returns the parameters at `keys` (a view)."""
        params = self.shard.params[keys]
        if not self._finite(values, out):
            return params
        contribution = self.rule.contribute(params, values, out)
        round_sum = self.shard.round_sum
        if round_sum is not None:
            # BSP folds only clock == min_clock, so a round never mixes clocks.
            round_sum[keys].add_(contribution)
        else:
            self.rule.commit(params, self.shard.state_at(keys), contribution, 1)
        return params

    def payload(self, payload: list[torch.Tensor], clock: int) -> torch.Tensor | None:
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
            keys = slice(offset, offset + values.numel())
            self.chunk(keys, values, None if out is None else out[keys])
            offset = keys.stop
        self.counters["pushes"] += 1
        if synchronous:
            shard.round_count, shard.round_clock = shard.round_count + 1, clock
        else:
            shard.step += 1
        return out

    def _finite(self, chunk: torch.Tensor, out: torch.Tensor | None) -> bool:
        """A chunk holding NaN or Inf contributes nothing (its reply part is zero) and is
        counted, so one diverged worker cannot poison the shared parameters. The sum is a cheap
        test (a pass at memory speed); it also refuses values so large their sum overflows."""
        if bool(torch.isfinite(chunk.sum())):
            return True
        self.rejected["nonfinite"] += 1
        if out is not None:
            out.zero_()
        return False

    def maybe_commit_round(self) -> None:
        shard = self.shard
        if shard.round_sum is None or shard.round_count == 0:
            return
        if self.clocks.min_clock() > shard.round_clock:  # every live worker folded this round
            self.replies.release_for_writing()
            self.rule.commit(shard.params, shard.rule_state, shard.round_sum, shard.round_count)
            shard.step += 1
            shard.round_sum.zero_()
            shard.round_count = 0
