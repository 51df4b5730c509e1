"""When an easgd worker exchanges with the center: every tau local steps (`fixed`), at the
period the throughput model picks from the costs this worker measures (`auto`), or once the
training loss summed since the last exchange passes what the first period summed (`loss`,
DeepSpark's trigger). docs/tau.md has the formulas and the reasons for their constants."""

from __future__ import annotations

import math
import statistics
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from ember.config import RunConfig, StrategyPart

TAU_MIN, TAU_MAX = 1, 256  # the periods `auto` and `loss` may choose
MARGIN = 1.25  # auto: a period's compute covers this many exchange wall times, for their jitter
OVERHEAD = 0.1  # auto: an exchange may cost at most this share of its period's compute
BAND = 1.25  # auto: hysteresis, a new tau differs from the current one by more than this factor
STEP = 2  # auto: and by at least this many steps, unless an exchange was overdue
SETTLE = 4  # auto: exchanges at a tau before it may change, unless an exchange was overdue
SETTLE_STEPS = 256  # auto: and local steps, so a small tau is not changed every few steps
PROBE = 4  # auto: the least tau while an exchange's cost to compute is not yet measured
WINDOW = 8  # recent exchanges (and periods) whose median the choices take
STEPS = 64  # recent steps whose mean is the step time the exchange has to be covered by
WARMUP = 20  # first local steps left out of every figure: connecting, first touches of memory


@dataclass(frozen=True)
class TauChange:
    """A period chosen after local step `step`, and the figures behind it."""

    step: int
    tau: int
    previous: int | None
    reason: str  # start | measured | loss
    t_comp: float | None  # seconds per local step, recent
    t_comm: float | None  # seconds per exchange, recent median
    details: dict[str, float] = field(default_factory=dict)


class Period:
    """A fixed period: an exchange after every tau-th local step, counted from step 0, so a
    resumed worker keeps the phase that synchronous rounds depend on."""

    policy = "fixed"
    adaptive = False  # whether the worker loop feeds it step times (and losses)
    wants_loss = False

    def __init__(self, tau: int) -> None:
        self.tau = tau
        self.changes: list[TauChange] = []  # chosen since the worker loop last drained them
        self.lengths: Counter[int] = Counter()  # local steps of each period that ended
        self.since = 0  # local steps since the last exchange began

    def exchange_now(self, done: int) -> bool:
        """Asked after local step `done` (counted from 1): whether to exchange now. True means
        the caller begins an exchange."""
        self.since += 1
        if done % self.tau:
            return False
        self._begin()
        return True

    def _begin(self) -> None:
        self.lengths[self.since] += 1
        self.since = 0

    def exchanged(self, seconds: float) -> None:
        """An exchange this worker began has finished after `seconds` of wall time."""

    def add_step(self, seconds: float) -> None:
        """A local step's compute, its waits on the network left out (adaptive only)."""

    def add_loss(self, loss: float) -> None:
        """A local step's training loss, before its exchange_now (`loss` only)."""

    def summary(self) -> dict[str, Any]:
        """The policy, the last period and the median of the periods run (low median)."""
        median, left = self.tau, (sum(self.lengths.values()) - 1) // 2
        for length in sorted(self.lengths):
            median, left = length, left - self.lengths[length]
            if left < 0:
                break
        return {"tau_policy": self.policy, "tau_final": self.tau, "tau_median": median}


class _Measured(Period):
    """A period that adapts, from the recent exchange wall times, step times, and each period's
    cost of its exchange to compute: what the steps its exchange touched (in flight, begun or
    applied) took beyond the mean of its clean steps, those no exchange touched.

    An exchange that falls due while the last one is still in flight is put off, not waited
    for: compute goes on and the exchange begins at the first step after the last one is
    back, so an adaptive period never stalls a worker on the network (a fixed one does, to
    keep its period)."""

    adaptive = True

    def __init__(self, tau: int) -> None:
        super().__init__(min(max(tau, TAU_MIN), TAU_MAX))
        self.exchanges: deque[float] = deque(maxlen=WINDOW)  # wall seconds
        self.steps: deque[float] = deque(maxlen=STEPS)  # compute seconds per step
        self._steps_sum = 0.0  # of self.steps, kept as they come and go
        self.t0s: deque[float] = deque(maxlen=WINDOW)  # median clean step of recent periods
        self.costs: deque[float] = deque(maxlen=WINDOW)  # and its exchange's cost to compute
        self.done = 0  # local steps done, as exchange_now was last told
        self._window: list[float] = []  # step seconds since the last exchange began
        self._clean: list[float] = []  # of which clean
        self._fed = 0  # steps fed so far, warm-up included
        self._measurable = False  # the window began after the warm-up and an exchange
        self._in_flight = 0  # exchanges begun and not yet applied: 0 or 1
        self._touched = False  # an exchange touched the step under way
        self.overdue = False  # an exchange fell due with the previous one in flight
        self._record(self.tau, None, "start")

    def exchange_now(self, done: int) -> bool:
        self.done = done
        self.since += 1
        if self._in_flight:  # put off until the last exchange is back
            self.overdue = self.overdue or self.since >= self.tau
            return False
        if not self._due():
            return False
        if self._measurable and len(self._clean) >= 2:  # a period whose costs tell apart
            # The touched steps' excess over the clean ones' mean: a mean, since a median
            # would count a noisy host's long tail as cost; and only the touched steps, so
            # what noise remains does not grow with tau (nor tau with it).
            clean = sum(self._clean)
            t0 = clean / len(self._clean)
            touched = len(self._window) - len(self._clean)
            self.t0s.append(t0)
            self.costs.append(sum(self._window) - clean - touched * t0)
        self._window, self._clean = [], []
        self._measurable = self._fed >= WARMUP
        self._in_flight += 1
        self._touched = True
        self._begin()
        return True

    def _due(self) -> bool:
        return self.since >= self.tau

    def exchanged(self, seconds: float) -> None:
        self.exchanges.append(seconds)
        # the final exchange was never asked about, so the count stops at zero
        self._in_flight, self._touched = max(0, self._in_flight - 1), True  # this step applies it

    def add_step(self, seconds: float) -> None:
        self._fed += 1
        if self._fed > WARMUP:
            if len(self.steps) == STEPS:
                self._steps_sum -= self.steps[0]
            self.steps.append(seconds)
            self._steps_sum += seconds
            self._window.append(seconds)
            if not self._touched:
                self._clean.append(seconds)
        self._touched = self._in_flight > 0

    def t_comp(self) -> float | None:
        """Seconds per local step, recent, exchange costs included."""
        return self._steps_sum / len(self.steps) if self.steps else None

    def t_comm(self) -> float | None:
        return statistics.median(self.exchanges) if self.exchanges else None

    def _record(self, tau: int, previous: int | None, reason: str, **details: float) -> None:
        self.changes.append(
            TauChange(self.done, tau, previous, reason, self.t_comp(), self.t_comm(), details)
        )


class AutoPeriod(_Measured):
    """The smallest tau within OVERHEAD of the best throughput the overlapped model gives,
    `tau * B / max(tau * t0 + c, T_comm)`: its compute covers the exchange with MARGIN to spare
    (`tau * t_step >= MARGIN * T_comm`, t_step = t0 + c / tau, the measured step) and the
    exchange's cost c to compute is at most OVERHEAD of it (`c <= OVERHEAD * tau * t0`). A
    larger tau buys at most that share of speed and costs divergence.

    Hysteresis: when an exchange was overdue, a larger target is taken at once; else a
    change needs SETTLE exchanges and SETTLE_STEPS steps at the current tau, a target outside
    BAND and STEP of it, and to come down, c measured and the slowest recent exchange covered.
    Until a period has told c apart from t0, tau stays at PROBE or more, the least that leaves
    steps to tell them by."""

    policy = "auto"

    def __init__(self, tau: int) -> None:
        super().__init__(tau)
        self._unchanged = 0  # exchanges since tau last changed
        self._changed_at = 0  # the local step it last changed at

    def exchanged(self, seconds: float) -> None:
        super().exchanged(seconds)
        self._unchanged += 1
        overdue, self.overdue = self.overdue, False
        # overdue: the median lags a link that just slowed, this exchange does not
        up, down, figures = self.targets(seconds if overdue else 0.0)
        if up is None or down is None:
            return
        settled = self._unchanged >= SETTLE and self.done - self._changed_at >= SETTLE_STEPS
        if up > self.tau and (overdue or (settled and up > self.tau * BAND + STEP - 1)):
            self._change(up, figures)
        elif settled and "c" in figures and down * BAND < self.tau and self.tau - down >= STEP:
            self._change(down, figures)

    def _change(self, tau: int, figures: dict[str, float]) -> None:
        previous, self.tau, self._unchanged, self._changed_at = self.tau, tau, 0, self.done
        self._record(tau, previous, "measured", **figures)

    def targets(self, latest: float = 0.0) -> tuple[int | None, int | None, dict[str, float]]:
        """The tau to raise to and the tau to lower to, which also covers the slowest recent
        exchange, and the figures: t0 (a step's bare compute) and c (an exchange's cost to
        compute) once measured, and the tau each bound asks for. The exchange's wall time is
        the recent median, or `latest` if that is longer."""
        t_step, t_comm = self.t_comp(), self.t_comm()
        if t_step is None or t_comm is None or t_step <= 0:
            return None, None, {}
        cover = math.ceil(MARGIN * max(t_comm, latest) / t_step)
        slowest = math.ceil(max(self.exchanges) / t_step)
        figures: dict[str, float] = {"tau_cover": cover, "tau_slowest": slowest}
        if latest > t_comm:
            figures["t_comm_latest"] = latest
        amortize = PROBE
        if self.costs:  # kept from the last periods that had clean steps, if none lately
            t0, c = statistics.median(self.t0s), max(0.0, statistics.median(self.costs))
            amortize = math.ceil(c / (OVERHEAD * t0)) if t0 > 0 else TAU_MAX
            figures.update(t0=t0, c=c, tau_amortize=amortize)
        up = min(max(cover, amortize, TAU_MIN), TAU_MAX)
        return up, min(max(up, slowest), TAU_MAX), figures


class LossPeriod(_Measured):
    """DeepSpark's trigger: the first period runs tau steps and sums its training loss L0;
    after it, exchange once the loss summed since the last exchange exceeds L0 (and after
    TAU_MAX steps at most, so a worker whose loss has all but vanished still exchanges), or,
    if the last exchange is still in flight then, at the first step after it is back."""

    policy = "loss"
    wants_loss = True

    def __init__(self, tau: int) -> None:
        super().__init__(tau)
        self.threshold: float | None = None  # L0, once the first period is over
        self.accumulated = 0.0  # loss summed since the last exchange began

    def add_loss(self, loss: float) -> None:
        self.accumulated += loss

    def _due(self) -> bool:
        if self.threshold is None:
            if self.since < self.tau:
                return False
            self.threshold = self.accumulated
        elif self.accumulated <= self.threshold and self.since < TAU_MAX:
            return False
        if self.since != self.tau:
            previous, self.tau = self.tau, self.since
            self._record(self.tau, previous, "loss", loss=self.accumulated, L0=self.threshold)
        self.accumulated = 0.0
        return True


def make_period(config: StrategyPart | RunConfig) -> Period:
    """The period object of the configured tau policy, starting at the configured tau."""
    kinds: dict[str, type[Period]] = {"auto": AutoPeriod, "loss": LossPeriod}
    return kinds.get(config.tau_policy, Period)(config.tau)
