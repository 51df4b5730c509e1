"""ClockTable alone: saved tables, re-registration and incarnations (no sockets)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.errors import ProtocolError
from ember.ps.clocks import ClockTable


def _table(*clocks: int) -> ClockTable:
    table = ClockTable(0, None, timeout=30.0, startup_grace=120.0)
    for worker, clock in enumerate(clocks):
        table.register(worker, 0, 0).clock = clock
    return table


def test_a_saved_table_keeps_finished_workers_out_of_min_clock_and_refuses_them() -> None:
    table = _table(5, 3)
    table.finish(table.entries[1])
    saved = table.table()
    assert saved == {
        "0": {"clock": 5, "step": 0, "finished": False, "incarnation": 0},
        "1": {"clock": 3, "step": 0, "finished": True, "incarnation": 0},
    }
    restored = ClockTable(2, saved, timeout=30.0, startup_grace=120.0)
    # a restored entry waits for its worker to register again
    assert restored.table()["0"]["incarnation"] == -1
    assert restored.min_clock() == 5
    assert not restored.entries[1].live and restored.entries[1].finished
    with pytest.raises(ProtocolError, match="already finished"):
        restored.known(1, -1)


def test_registering_the_same_incarnation_revives_a_dropped_entry_level_with_the_slowest() -> None:
    table = _table(1, 4, 6)
    dropped = table.entries[0]
    dropped.last_seen -= 100
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
    assert table.entries[0] is new
    with pytest.raises(ProtocolError, match="is not newer"):
        table.register(0, 0, 0)


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.floats(allow_nan=False)
    | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=7) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(_JSON, st.dictionaries(st.sampled_from(["0", "1", "x"]), _JSON, max_size=2)))
def test_a_replica_table_of_any_shape_restores_or_is_refused_leaving_the_old_one(table) -> None:
    clocks = _table(4, 2)
    before = clocks.replica_table()
    try:
        clocks.restore(table)
    except ProtocolError:
        assert clocks.replica_table() == before
