"""The consistency policies decide readiness from two clocks alone."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ember.ps import Asynchronous, BulkSynchronous, StaleSynchronous, make_consistency


@given(st.integers(0, 1000), st.integers(0, 1000), st.integers(0, 20))
def test_ssp_worker_waits_exactly_when_more_than_s_clocks_ahead(worker, slowest, s) -> None:
    assert StaleSynchronous(s).ready(worker, slowest) == (worker - slowest <= s)


@given(st.integers(0, 1000), st.integers(0, 1000))
def test_bsp_is_ssp_with_zero_staleness_and_commits_per_round(worker, slowest) -> None:
    assert BulkSynchronous().ready(worker, slowest) == (worker <= slowest)
    assert BulkSynchronous().synchronous and not StaleSynchronous(0).synchronous


@given(st.integers(0, 1000), st.integers(0, 1000))
def test_async_never_waits(worker, slowest) -> None:
    assert Asynchronous().ready(worker, slowest)


def test_make_consistency_maps_names_to_policies() -> None:
    assert make_consistency("ssp", 3) == StaleSynchronous(3)
    assert make_consistency("bsp").name == "bsp"
    assert make_consistency("async").name == "async"
