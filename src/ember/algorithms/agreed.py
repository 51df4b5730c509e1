"""diloco's `--tau auto`: rank 0 picks the period once from what it measured, every worker
follows it from the same round (docs/tau.md, "diloco")."""

from __future__ import annotations

import math
import statistics
from collections import deque

from ember.algorithms.period import OVERHEAD, STEPS, WARMUP, WINDOW, Period, TauChange

# The periods rank 0 may name. Below 50 steps the outer momentum extrapolates from a few
# minibatches' change each round (docs/diloco.md, Measured); 500 is the paper's period, beyond
# which a round saves under a tenth of a period's time on any link the figures below allow.
AGREED_MIN, AGREED_MAX = 50, 500
ROUNDS = 2  # rounds timed after WARMUP before rank 0 decides


class AgreedPeriod(Period):
    """A period every worker of a BSP round shares, counted from the last exchange.

    diloco's round blocks the workers (there is no exchanger to hide it), so a period of tau
    steps of t seconds costs tau t + T, T the round's wall time, and the round's share of it
    falls as 1 / tau: rank 0 takes the smallest tau at which the round costs at most OVERHEAD
    of the period's compute, `tau = ceil(T / (OVERHEAD t))`, clamped to AGREED_MIN..AGREED_MAX,
    once ROUNDS rounds after WARMUP steps were timed. It names that tau with each push from
    then on; the servers put it in every reply of the round, and each worker (rank 0 too)
    runs it from that round on. A worker that restarts runs the configured tau until its
    first reply names the agreed one: rounds pair by their count, not by steps, so that one
    period of its own holds no round up."""

    policy = "auto"
    adaptive = True  # the worker loop feeds it each step's compute seconds

    def __init__(self, tau: int, decides: bool) -> None:
        super().__init__(tau)
        self.decides = decides  # rank 0
        self.proposal: int | None = None  # the tau rank 0 names, once decided
        self.done = 0  # local steps so far
        self.steps: deque[float] = deque(maxlen=STEPS)
        self.rounds: deque[float] = deque(maxlen=WINDOW)
        self.changes.append(TauChange(0, tau, None, "start", None, None))

    def exchange_now(self, done: int) -> bool:
        # counted from the last exchange, so a new tau starts at the round that named it
        self.done = done
        self.since += 1
        if self.since < self.tau:
            return False
        self._begin()
        return True

    def add_step(self, seconds: float) -> None:
        if self.done > WARMUP:
            self.steps.append(seconds)

    def exchanged(self, seconds: float) -> None:
        if not self.decides or self.proposal is not None or self.done <= WARMUP:
            return
        self.rounds.append(seconds)
        if len(self.rounds) < ROUNDS or not self.steps:
            return
        t_step, t_round = statistics.fmean(self.steps), statistics.median(self.rounds)
        wanted = math.ceil(t_round / (OVERHEAD * t_step)) if t_step > 0 else AGREED_MAX
        self.proposal = min(max(wanted, AGREED_MIN), AGREED_MAX)

    def follow(self, tau: int) -> None:
        """The period a reply named: run it from this round on."""
        if tau == self.tau:
            return
        previous, self.tau = self.tau, tau
        t_step = statistics.fmean(self.steps) if self.steps else None
        t_round = statistics.median(self.rounds) if self.rounds else None
        self.changes.append(TauChange(self.done, tau, previous, "agreed", t_step, t_round))
