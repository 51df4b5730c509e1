"""diloco's `--tau auto` (algorithms/agreed.py): rank 0 names one period from the round's wall
time and the step time it measured; every worker runs the period a reply names."""

from __future__ import annotations

import pytest

from ember.algorithms.agreed import AGREED_MAX, AGREED_MIN, ROUNDS, AgreedPeriod
from ember.algorithms.period import WARMUP


def _run(period: AgreedPeriod, steps: int, step_seconds: float, round_seconds: float) -> list:
    """Local steps 1..steps; each round timed at `round_seconds`. The steps it exchanged at."""
    exchanged = []
    for done in range(1, steps + 1):
        if period.exchange_now(done):
            exchanged.append(done)
            period.exchanged(round_seconds)
        period.add_step(step_seconds)
    return exchanged


@pytest.mark.parametrize(
    ("round_seconds", "tau"),
    [(0.03, 150), (0.031, 155), (0.001, AGREED_MIN), (2.0, AGREED_MAX)],
)
def test_rank_0_names_the_smallest_tau_whose_round_costs_a_tenth_of_its_compute(
    round_seconds: float, tau: int
) -> None:
    period = AgreedPeriod(8, decides=True)
    exchanged = _run(period, WARMUP + 8 * ROUNDS + 8, 0.002, round_seconds)
    assert period.proposal == tau  # ceil(T / (0.1 * 2 ms)), clamped
    # decided only from rounds timed after the warm-up, ROUNDS of them
    timed = [step for step in exchanged if step > WARMUP]
    assert len(timed) > ROUNDS
    assert period.tau == 8  # named, not yet run: it runs once a reply names it


def test_no_other_worker_names_a_period() -> None:
    period = AgreedPeriod(8, decides=False)
    _run(period, 200, 0.002, 0.03)
    assert period.proposal is None and period.tau == 8


def test_a_named_period_runs_from_the_round_that_named_it() -> None:
    period = AgreedPeriod(8, decides=False)
    assert _run(period, 40, 0.002, 0.03) == [8, 16, 24, 32, 40]
    period.follow(60)  # the reply of the round at step 40
    assert [c.reason for c in period.changes] == ["start", "agreed"]
    assert (period.changes[-1].step, period.changes[-1].tau) == (40, 60)
    following = [done for done in range(41, 200) if period.exchange_now(done)]
    assert following == [100, 160]
    period.follow(60)  # every later reply names it again: nothing changes
    assert len(period.changes) == 2
    assert period.summary()["tau_final"] == 60
