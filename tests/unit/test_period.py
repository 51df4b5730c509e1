"""The exchange period's choices on fed figures: a simulated easgd-async worker whose steps
compute for t0 seconds, whose exchanges cost its compute c and take t_comm of wall time in the
background, and whose compute waits when a fixed period's exchange falls due with the last one
in flight (an adaptive period puts it off instead)."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from ember.algorithms.period import (
    TAU_MAX,
    AutoPeriod,
    LossPeriod,
    Period,
    TauChange,
    make_period,
)
from ember.config import RunConfig
from ember.metrics import summarize_workers

Figure = float | Callable[[int], float]


def at(figure: Figure, step: int) -> float:
    return figure(step) if callable(figure) else figure


def simulate(period: Period, steps: int, t0: Figure, c: Figure, t_comm: Figure) -> list[int]:
    """Drive `period` as AsyncEASGD and the worker loop do; return the steps it exchanged at."""
    clock, arrival, exchanged = 0.0, None, []
    for done in range(1, steps + 1):
        seconds = at(t0, done)
        clock += seconds
        if arrival is not None and arrival <= clock:  # applied at this step's boundary
            period.exchanged(at(t_comm, done))
            arrival = None
        if period.exchange_now(done):
            if arrival is not None:  # a fixed period: compute waits for the one in flight
                clock = arrival
                period.exchanged(at(t_comm, done))
            cost = at(c, done)
            seconds += cost
            clock += cost
            arrival = clock + at(t_comm, done)
            exchanged.append(done)
        period.add_step(seconds)
    return exchanged


def measured(period: Period) -> list[TauChange]:
    return [change for change in period.changes if change.reason == "measured"]


def test_cheap_compute_and_a_dear_exchange_make_a_large_tau() -> None:
    period = AutoPeriod(8)
    simulate(period, 4000, t0=0.0015, c=0.0002, t_comm=0.17)  # 100 Mbit against mlp's steps
    # tau * t_step covers 1.25 exchanges: ceil(1.25 * 0.17 / 0.0015) = 142
    assert 130 <= period.tau <= 150
    change = measured(period)[0]
    assert change.previous == 8 and change.t_comm == pytest.approx(0.17)
    assert change.t_comp == pytest.approx(0.0015, rel=0.1)
    slower = AutoPeriod(8)  # a second away
    simulate(slower, 4000, t0=0.0015, c=0.0002, t_comm=1.0)
    assert slower.tau == TAU_MAX  # clamped


def test_dear_compute_makes_tau_1() -> None:
    period = AutoPeriod(8)
    simulate(period, 400, t0=0.05, c=0.0001, t_comm=0.001)
    assert period.tau == 1
    assert [(c.previous, c.tau) for c in measured(period)] == [(8, 1)]


def test_an_exchange_that_costs_compute_is_amortized() -> None:
    # On one host the exchange's CPU comes out of compute: c / (0.1 * t0) = 10.7 -> 11
    period = AutoPeriod(1)
    simulate(period, 3000, t0=0.0015, c=0.0016, t_comm=0.001)
    assert 9 <= period.tau <= 13
    figures = period.changes[-1].details
    assert figures["c"] == pytest.approx(0.0016, rel=0.05)
    assert figures["t0"] == pytest.approx(0.0015, rel=0.05)


def test_a_noisy_host_without_exchange_costs_does_not_drive_tau_up() -> None:
    # one step in ten preempted for 10x its time, and an exchange that costs compute nothing
    rng = random.Random(1)
    steps = [0.015 if rng.random() < 0.1 else 0.0015 for _ in range(20_001)]
    period = AutoPeriod(8)
    simulate(period, 20_000, t0=steps.__getitem__, c=0.0, t_comm=0.001)
    assert period.tau <= 8
    assert all(change.tau <= 8 for change in period.changes)


def test_tau_follows_costs_that_move() -> None:
    def t_comm(step: int) -> float:
        return 0.1 if 3000 <= step < 8000 else 0.01  # the link slows, then recovers

    period = AutoPeriod(8)
    exchanged_at = simulate(period, 14000, t0=0.001, c=0.00005, t_comm=t_comm)
    taus = {change.step: change.tau for change in period.changes}
    before = [tau for step, tau in taus.items() if step < 3000]
    during = [tau for step, tau in taus.items() if 3000 <= step < 8000]
    after = [tau for step, tau in taus.items() if step >= 8000]
    assert 12 <= before[-1] <= 16  # ceil(1.25 * 0.01 / 0.00105)
    assert 110 <= during[-1] <= 130  # and at 0.1 s
    raised = next(change for change in period.changes if change.step >= 3000)
    # as soon as the first slow exchange is back (0.1 s of 1 ms steps), not after SETTLE more
    assert raised.step < 3000 + 16 + 100 + 16
    assert raised.details["t_comm_latest"] == 0.1
    assert after and 12 <= after[-1] <= 16 and period.tau == after[-1]
    assert len(exchanged_at) > 14000 / 130


def test_noisy_costs_do_not_make_it_flap() -> None:
    for seed in range(5):
        rng = random.Random(seed)
        noise = [rng.uniform(0.007, 0.013) for _ in range(20_001)]  # 10 ms, +-30%
        period = AutoPeriod(8)
        exchanged = simulate(period, 20_000, t0=0.001, c=0.00005, t_comm=noise.__getitem__)
        # about 1,500 exchanges; the rare run of fast ones lowers tau, overdue ones raise it back
        assert len(measured(period)) <= 15, seed
        assert all(10 <= change.tau <= 16 for change in measured(period)), seed
        assert len(exchanged) > 20_000 / 16


def test_the_loss_trigger_fires_when_the_loss_since_the_exchange_passes_the_first_periods() -> None:
    period = LossPeriod(8)
    exchanged = []
    for done in range(1, 200):
        period.add_loss(1.0 if done <= 8 else 0.5)  # the first period sums 8.0
        if period.exchange_now(done):
            exchanged.append(done)
            period.exchanged(0.0001)  # back before the next step
        period.add_step(0.001)
    # then 17 steps of 0.5 pass 8.0 (16 only reach it)
    assert exchanged[:4] == [8, 25, 42, 59]
    assert period.threshold == 8.0 and period.tau == 17
    change = [c for c in period.changes if c.reason == "loss"]
    assert [(c.step, c.previous, c.tau) for c in change] == [(25, 8, 17)]
    assert change[0].details == {"loss": 8.5, "L0": 8.0}


def test_the_loss_trigger_exchanges_after_tau_max_steps_at_most() -> None:
    period = LossPeriod(4)
    exchanged = []
    for done in range(1, 1000):
        period.add_loss(1.0 if done <= 4 else 0.0)  # a loss that has vanished
        if period.exchange_now(done):
            exchanged.append(done)
            period.exchanged(0.0001)
    assert exchanged[:3] == [4, 4 + TAU_MAX, 4 + 2 * TAU_MAX]


def test_an_exchange_due_while_the_last_is_in_flight_is_put_off_not_waited_for() -> None:
    for period in (AutoPeriod(8), LossPeriod(8)):
        begun = []
        for done in range(1, 101):
            if done == 60:  # the first exchange is back after 52 steps of 1 ms
                period.exchanged(0.052)
            period.add_loss(1.0)
            if period.exchange_now(done):
                begun.append(done)
            period.add_step(0.001)
        if isinstance(period, AutoPeriod):
            # 16 fell due with it in flight: put off, and at its return tau rises at once to
            # cover the exchange, ceil(1.25 * 0.052 / 0.001) = 65, counted from step 8
            assert begun == [8, 73], period.changes
            assert measured(period)[0].tau == 65 and measured(period)[0].step == 59
        else:  # the loss passed L0 long ago: the put-off exchange begins when the last is back
            assert begun[:2] == [8, 60]
            assert period.tau == 52  # the period it ran
    fixed = Period(8)  # a fixed period keeps its phase: the caller waits
    assert [done for done in range(1, 20) if fixed.exchange_now(done)] == [8, 16]


def test_a_fixed_period_keeps_its_phase_across_a_resume_and_sums_up() -> None:
    period = Period(8)
    exchanged = [done for done in range(101, 140) if period.exchange_now(done)]
    assert exchanged == [104, 112, 120, 128, 136]
    assert period.summary() == {"tau_policy": "fixed", "tau_final": 8, "tau_median": 8}
    assert period.changes == [] and not period.adaptive


def test_the_summary_has_the_final_and_median_tau() -> None:
    period = LossPeriod(8)
    for done in range(1, 60):
        period.add_loss(1.0 if done <= 8 else 0.5)
        if period.exchange_now(done):
            period.exchanged(0.0001)
    assert period.summary() == {"tau_policy": "loss", "tau_final": 17, "tau_median": 17}


def test_make_period_follows_the_config() -> None:
    def config(policy: str) -> RunConfig:
        return RunConfig(strategy="easgd-async", tau=16, tau_policy=policy).validate()

    assert type(make_period(config("fixed"))) is Period
    auto = make_period(config("auto"))
    assert isinstance(auto, AutoPeriod) and auto.tau == 16
    assert auto.changes[0].reason == "start" and auto.changes[0].tau == 16
    assert isinstance(make_period(config("loss")), LossPeriod)


def test_the_run_summary_has_each_workers_final_and_median_tau() -> None:
    done = [
        {"rank": 1, "seconds": 2.0, "tau_policy": "auto", "tau_final": 12, "tau_median": 11},
        {"rank": 0, "seconds": 2.0, "tau_policy": "auto", "tau_final": 14, "tau_median": 13},
    ]
    summary = summarize_workers(done, 3.0)
    assert summary["tau_policy"] == "auto"
    assert summary["tau_per_worker"] == {
        "1": {"final": 12, "median": 11},
        "0": {"final": 14, "median": 13},
    }
    assert "tau_policy" not in summarize_workers([{"rank": 0, "seconds": 1.0}], 1.0)
