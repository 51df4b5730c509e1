"""ClockTable alone: saved tables, re-registration, incarnations, pruning and its bound, and
the table's rows (no sockets)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.errors import ProtocolError
from ember.ps.clockrows import COLUMNS, check_rows, rows_to_table
from ember.ps.clocks import NO_LIVE_WORKER, ClockTable
from ember.ps.consistency import BulkSynchronous, StaleSynchronous


def _table(*clocks: int, expected: int | None = None, **kwargs: int) -> ClockTable:
    """Workers 0.. at `clocks`, all of them the run's own unless `expected` says fewer."""
    expected = len(clocks) if expected is None else expected
    table = ClockTable(expected, None, timeout=30.0, startup_grace=120.0, **kwargs)
    for worker, clock in enumerate(clocks):
        table.register(worker, 0, 0).clock = clock
    return table


def _silence(table: ClockTable, worker: int, seconds: float) -> None:
    table.entries[worker].last_seen -= seconds


def test_a_saved_table_keeps_finished_workers_out_of_min_clock_and_refuses_them() -> None:
    table = _table(5, 3)
    table.finish(1)
    saved = table.table()
    assert saved == {
        "0": {"clock": 5, "step": 0, "finished": False, "incarnation": 0},
        "1": {"clock": 3, "step": 0, "finished": True, "incarnation": 0},
    }
    restored = ClockTable(2, {int(k): v for k, v in saved.items()}, 30.0, startup_grace=120.0)
    # a restored entry waits for its worker to register again
    assert restored.table()["0"]["incarnation"] == -1
    assert restored.min_clock() == 5
    assert not restored.entries[1].live and restored.entries[1].finished
    with pytest.raises(ProtocolError, match="already finished"):
        restored.known(1, -1)


def test_registering_the_same_incarnation_revives_a_dropped_entry_level_with_the_slowest() -> None:
    table = _table(1, 4, 6)
    _silence(table, 0, 100)
    dropped = table.entries[0]
    assert table.drop_silent(set()) == [0]
    assert table.register(0, 0, 0) is dropped
    assert dropped.live and dropped.clock == 4  # rounds the others closed stay closed
    assert table.events[-1] == {"event": "rejoin", "worker": 0, "clock": 4}
    live = table.entries[2]
    assert table.register(2, 0, 0) is live and live.clock == 6  # a live one just goes on


def test_a_newer_incarnation_replaces_an_entry_and_an_older_one_is_refused() -> None:
    table = _table(3)
    old = table.entries[0]
    new = table.register(0, 1, 0)
    assert new is not old and new.incarnation == 1 and new.clock == 3 and not old.live
    assert table.entries[0] is new and len(table.entries) == 1  # superseded, not kept beside
    with pytest.raises(ProtocolError, match="is not newer"):
        table.register(0, 0, 0)


def test_a_finished_joiner_is_forgotten_and_a_finished_worker_of_the_run_is_kept() -> None:
    table = _table(2, 2)
    for joiner in range(2, 1002):
        table.register(joiner, 0, 0)
        table.finish(joiner)
    table.finish(1)
    assert sorted(table.entries) == [0, 1] and table.entries[1].finished
    assert table.min_clock() == 2


def test_a_silent_joiner_is_kept_a_while_to_come_back_then_forgotten() -> None:
    table = _table(0, 0)
    table.register(7, 0, 0)
    for worker in (1, 7):
        _silence(table, worker, table.timeout + 1)
    assert table.drop_silent(set()) == [1, 7]
    assert 7 in table.entries  # still within the retention: it may speak again
    for worker in (1, 7):
        _silence(table, worker, table.retention)
    table.drop_silent(set())
    assert sorted(table.entries) == [0, 1]  # the run's own worker stays for a resume
    with pytest.raises(ProtocolError, match="worker 7 incarnation 0 is not registered"):
        table.known(7, 0)


def test_a_registration_past_max_workers_forgets_the_longest_silent_joiner_or_is_refused() -> None:
    table = _table(0, 0, max_workers=5)
    for joiner in (2, 3, 4):
        table.register(joiner, 0, 0)
    with pytest.raises(ProtocolError) as refused:
        table.register(5, 0, 0)
    message = str(refused.value)
    assert "worker 5 cannot register: this shard already holds max_workers=5 workers" in message
    assert "(2 of the run, 5 live)" in message and "let joined workers finish" in message
    assert sorted(table.entries) == [0, 1, 2, 3, 4]
    for joiner, silent in ((3, 200), (4, 100)):
        _silence(table, joiner, silent)
    table.drop_silent(set())
    table.register(5, 0, 0)  # room made by forgetting 3, silent the longest
    assert sorted(table.entries) == [0, 1, 2, 4, 5]
    table.register(1, 1, 0)  # a worker of the run always finds its place
    with pytest.raises(ProtocolError, match="must be in"):
        table.register(1 << 62, 0, 0)


def test_a_saved_joiner_holds_nobody_and_goes_on_from_its_step_if_it_registers_again() -> None:
    saved = {
        0: {"clock": 4, "step": 40, "finished": False},
        9: {"clock": 2, "step": 20, "finished": False},
        10: {"clock": 1, "step": 10, "finished": True},
    }
    table = ClockTable(1, saved, timeout=30.0, startup_grace=120.0)
    assert sorted(table.entries) == [0, 9] and table.min_clock() == 4
    entry = table.register(9, 0, 0)
    assert (entry.clock, entry.step) == (4, 20)


def test_rows_carry_the_whole_table_and_a_copy_restores_it() -> None:
    table = _table(3, 1, expected=1)
    table.entries[1].step = 1 << 70  # a worker's own number, whatever it sent: clamped
    table.entries[1].answered_seq = 12
    rows = table.rows()
    assert rows.dtype == np.int64 and rows.shape == (2, len(COLUMNS))
    copy = _table(expected=1)
    copy.restore(rows)
    np.testing.assert_array_equal(copy.rows(), rows)
    assert copy.entries[1].last_seq == 12 and copy.entries[1].step == np.iinfo(np.int64).max
    _silence(table, 1, table.timeout + 1)
    table.drop_silent(set())
    assert list(table.rows(resume_only=True)[:, 0]) == [0]  # a silent joiner is not resumed
    assert rows_to_table(table.rows(resume_only=True)) == table.table()


def test_rows_that_are_not_a_table_are_refused_with_what_is_wrong() -> None:
    good = _table(1, 2).rows()
    cases = [
        (good.astype(np.int32), "workers must be int64 rows of"),
        (good[:, :6], "workers must be int64 rows of"),
        (np.concatenate([good, good[:1]]), "worker 0 has more than one row"),
        (good * [1, 1, 1, 1, 1, 2, 1], "live must be 0 or 1, got 2"),
        (good - [1, 0, 0, 0, 0, 0, 0], "worker -1 is outside [0, "),
        (good - [0, 2, 0, 0, 0, 0, 0], "incarnation -2 is outside [-1, "),
        ({"0": [0, 0, 0, 0, True, False]}, "workers must be int64 rows of"),
    ]
    for rows, message in cases:
        with pytest.raises(ProtocolError, match=message.replace("[", r"\[")):
            check_rows(rows, 16)
    with pytest.raises(ProtocolError, match="2 rows, more than the 1 allowed"):
        check_rows(good, 1)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.lists(st.integers(-3, 3), min_size=len(COLUMNS), max_size=len(COLUMNS)), max_size=4
    ),
    st.sampled_from([len(COLUMNS), len(COLUMNS) - 1]),
)
def test_rows_of_any_content_restore_or_are_refused_leaving_the_old_table(values, width) -> None:
    clocks = _table(4, 2)
    before = clocks.rows()
    rows = np.array(values, dtype=np.int64).reshape(-1, len(COLUMNS))[:, :width]
    try:
        clocks.restore(rows)
    except ProtocolError:
        np.testing.assert_array_equal(clocks.rows(), before)
    else:
        np.testing.assert_array_equal(clocks.rows(), rows)


# Churn against a model that forgets nothing: pruning must never change what BSP and SSP see.
_OPS = st.lists(
    st.tuples(
        st.sampled_from(["join", "push", "finish", "silence", "forget", "speak"]),
        st.integers(0, 7),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(_OPS, st.integers(0, 3))
def test_min_clock_and_readiness_match_a_table_that_forgets_nothing(ops, staleness) -> None:
    table = ClockTable(2, None, timeout=30.0, startup_grace=120.0, max_workers=6)
    for worker in (0, 1):
        table.register(worker, 0, 0)
    model: dict[int, tuple[int, bool]] = {0: (0, True), 1: (0, True)}  # worker -> clock, live
    next_joiner = 2
    for op, pick in ops:
        ids = sorted(table.entries)
        worker = ids[pick % len(ids)]
        entry = table.entries[worker]
        if op == "join":
            try:
                entry = table.register(next_joiner, 0, 0)
            except ProtocolError:
                # refused only when full, with no joiner silent or gone to forget
                assert len(table.entries) == 6
                assert all(e.live for w, e in table.entries.items() if w >= 2)
                continue
            model[next_joiner] = (entry.clock, True)
            next_joiner += 1
        elif op == "push" and entry.live:
            entry.clock += 1
            model[worker] = (entry.clock, True)
        elif op == "finish" and entry.live:
            table.finish(worker)
            model[worker] = (model[worker][0], False)
        elif op == "silence" and entry.live:
            _silence(table, worker, table.timeout + 1)
            table.drop_silent(set())
            model[worker] = (model[worker][0], False)
        elif op == "forget":
            for w in list(table.entries):
                _silence(table, w, table.retention + table.timeout + 2)
            for w in table.drop_silent(set()):
                model[w] = (model[w][0], False)
        elif op == "speak" and not entry.live and not entry.finished and entry.incarnation >= 0:
            entry = table.known(worker, entry.incarnation)
            model[worker] = (entry.clock, True)
        live = [clock for clock, alive in model.values() if alive]
        slowest = min(live, default=NO_LIVE_WORKER)
        assert table.min_clock() == slowest
        for policy in (BulkSynchronous(), StaleSynchronous(staleness)):
            for w, e in table.entries.items():
                if e.live:
                    assert policy.ready(e.clock, table.min_clock()) == policy.ready(
                        model[w][0], slowest
                    )
        assert len(table.entries) <= 6
        assert all(w in table.entries for w, (_, alive) in model.items() if alive or w < 2)


def test_the_runs_step_is_its_own_workers_furthest_and_no_joiners() -> None:
    table = ClockTable(2, None, timeout=30.0, startup_grace=120.0)
    assert table.run_step() == 0  # nobody has registered
    for worker in (0, 1, 7):
        table.register(worker, 0, server_step=0)
    table.entries[0].step, table.entries[1].step = 40, 55
    table.entries[7].step = 900  # a joiner's steps count its own rows, not the run's
    assert table.run_step() == 55
    table.entries[1].live = False  # dropped: where it got to still counts
    assert table.run_step() == 55


def test_a_worker_range_admits_joiners_up_to_its_max_and_counts_who_came_and_went() -> None:
    table = ClockTable(2, None, timeout=30.0, startup_grace=120.0, members_max=3)
    for worker in (0, 1, 10):
        table.register(worker, 0, server_step=0)
    with pytest.raises(ProtocolError, match="worker range is full, 3 of its at most 3"):
        table.register(11, 0, server_step=0)
    table.finish(10)  # the joiner leaves: room for another
    table.register(11, 0, server_step=0)
    assert (table.joins, table.leaves) == (2, 1)
    table.entries[11].last_seen -= 60  # silent past the timeout: dropped, a leave
    assert table.drop_silent(set()) == [11]
    assert table.summary()["joins"] == 2 and table.summary()["leaves"] == 2
    # a fixed run's table takes joiners without a ceiling of members, and counts them too
    fixed = ClockTable(1, None, timeout=30.0, startup_grace=120.0)
    for worker in range(1, 6):
        fixed.register(worker, 0, server_step=0)
    assert fixed.joins == 5
