"""diloco with `--tau auto` on real servers on 127.0.0.1: rank 0 names the period, the servers
carry it in the round's replies, and every worker runs it from the same round."""

from __future__ import annotations

from typing import Any

import pytest

from ember.algorithms.agreed import AGREED_MAX, AGREED_MIN, AgreedPeriod
from ember.config import RunConfig
from ember.errors import ConfigError
from tests.integration.test_diloco_oracles import _diloco

pytestmark = pytest.mark.timeout(60)
STEPS, START = 40 + 2 * AGREED_MAX + 10, 8
STEP_SECONDS = 1e-4  # each step's compute, as fed: a round on 127.0.0.1 costs 10x to 1000x it


def test_every_worker_runs_the_period_rank_0_names_from_the_same_round() -> None:
    algorithms: list[Any] = []
    _diloco(2, STEPS, START, 0.7, 0.9, 1, 1, "auto", algorithms, STEP_SECONDS)
    periods = sorted((a.period for a in algorithms), key=lambda p: not p.decides)
    assert all(isinstance(p, AgreedPeriod) for p in periods)
    first, second = periods
    agreed = first.proposal
    assert agreed is not None and AGREED_MIN <= agreed <= AGREED_MAX
    assert second.proposal is None  # only rank 0 names one
    # rounds timed at steps 24 and 32 (past the warm-up); the push at 40 names the period
    expected = [(0, START, "start"), (40, agreed, "agreed")]
    for period in (first, second):
        assert [(c.step, c.tau, c.reason) for c in period.changes] == expected
        assert period.tau == agreed
    # the same periods, so the same rounds: every worker exchanged at the same steps
    assert first.lengths == second.lengths
    assert first.lengths[START] == 5 and first.lengths[agreed] == (STEPS - 40) // agreed


def test_fragments_refuse_an_adaptive_tau_before_anything_starts() -> None:
    config = RunConfig(
        strategy="diloco", workers=1, servers=2, fragments=2, tau=8, tau_policy="auto"
    )  # fmt: skip
    with pytest.raises(ConfigError) as raised:
        config.validate()
    assert str(raised.value) == (
        "tau auto applies to diloco without --fragments: the fragments sync on a fixed"
        " schedule of tau / fragments steps; give an integer tau"
    )
