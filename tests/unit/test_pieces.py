"""The data cursor of a worker range's run (ps/pieces.py): every row once per epoch when no
member dies, the served rows of a dead member's pieces counted twice, and bounded input."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.errors import ProtocolError
from ember.ps.piece_protocol import Dealt, Take
from ember.ps.pieces import Geometry, PieceQueue, parse_cursor

CUT = Geometry(rows=100, piece_rows=10, epochs=2)


def drain(queue: PieceQueue, members: list[int], epoch: int) -> list[tuple[int, int]]:
    """Members take, start and finish pieces of `epoch` in turn until none is left."""
    trained = []
    active = list(members)
    while active:
        for worker in list(active):
            key = queue.take(worker, 0, epoch)
            if not isinstance(key, tuple):
                active.remove(worker)
                continue
            queue.start(worker, 0, key)
            queue.finish(worker, 0, key)
            trained.append(key)
    return trained


def test_every_row_is_dealt_once_an_epoch_when_nobody_dies() -> None:
    queue = PieceQueue(CUT, lease_seconds=30, waits=False)
    for epoch in range(2):
        trained = drain(queue, [0, 1, 2], epoch)
        assert sorted(trained) == [(epoch, piece) for piece in range(10)]
    assert queue.epoch_rows == [100, 100]
    assert queue.rows_trained_twice == 0 and queue.reissued == 0 and not queue.leases


def test_the_last_piece_takes_the_rows_left_over() -> None:
    cut = Geometry(rows=105, piece_rows=10, epochs=1)
    assert cut.pieces == 10 and cut.rows_of(9) == 15 and cut.rows_of(0) == 10
    queue = PieceQueue(cut, 30, waits=False)
    drain(queue, [0], 0)
    assert queue.epoch_rows == [105]


def test_a_dead_members_served_piece_is_dealt_again_and_counted_twice() -> None:
    queue = PieceQueue(CUT, 30, waits=False)
    served = queue.take(0, 0, 0)
    ahead = queue.take(0, 0, 0)  # dealt ahead, never served
    assert isinstance(served, tuple) and isinstance(ahead, tuple)
    queue.start(0, 0, served)
    queue.lost(0, older_than=1)  # its incarnation 1 registered: incarnation 0 died
    again = drain(queue, [1], 0)
    assert served in again and ahead in again and len(again) == 10
    assert queue.rows_trained_twice == 10  # the served piece's rows, not the one dealt ahead
    assert queue.reissued == 1 and queue.epoch_rows == [100, 0]


def test_a_member_that_leaves_keeps_what_it_served_and_gives_back_the_rest() -> None:
    queue = PieceQueue(CUT, 30, waits=False)
    served, ahead = queue.take(0, 0, 0), queue.take(0, 0, 0)
    assert isinstance(served, tuple) and isinstance(ahead, tuple)
    queue.start(0, 0, served)
    queue.leave(0, 0)
    assert queue.epoch_rows[0] == 10 and not queue.leases
    assert ahead in drain(queue, [1], 0)
    assert queue.rows_trained_twice == 0 and queue.epoch_rows[0] == 100


def test_a_lease_that_runs_out_goes_back_and_a_late_finish_still_counts_once() -> None:
    queue = PieceQueue(CUT, lease_seconds=5, waits=False)
    key = queue.take(0, 0, 0)
    assert isinstance(key, tuple)
    queue.start(0, 0, key)
    queue.expire(now=queue.leases[key].renewed + 6)
    assert not queue.leases
    queue.finish(0, 0, key)  # it was slow, not dead: nobody took it again meanwhile
    assert queue.epoch_rows[0] == 10 and queue.rows_trained_twice == 0
    assert key not in drain(queue, [1], 0)


def test_an_asynchronous_member_waits_for_pieces_held_elsewhere_in_the_last_epoch() -> None:
    for waits, expected in ((True, "wait"), (False, None)):
        queue = PieceQueue(Geometry(20, 10, 1), 30, waits=waits)
        first, second = queue.take(0, 0, 0), queue.take(1, 0, 0)
        assert isinstance(first, tuple) and isinstance(second, tuple)
        queue.start(1, 0, second)
        queue.finish(0, 0, first)
        assert queue.take(0, 0, 0) == expected  # member 1 may still die with its piece
        queue.lost(1)
        assert queue.take(0, 0, 0) == second


def test_an_epoch_opens_only_once_the_one_before_is_dealt_out() -> None:
    queue = PieceQueue(Geometry(20, 10, 3), 30, waits=False)
    assert queue.take(0, 0, 2) == (0, 0)  # a joiner asking ahead gets the oldest rows first
    assert queue.take(0, 0, 2) == (0, 1)
    assert queue.take(0, 0, 2) == (1, 0)
    assert set(queue.open) == {0, 1}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from("tslx")), max_size=80))
def test_every_row_is_trained_at_least_once_and_the_twice_count_is_exact(
    moves: list[tuple[int, str]],
) -> None:
    """Any order of takes, serves (s), leaves (l) and deaths (x) by three members, then the
    survivors finish: every piece is trained, and the rows counted twice are exactly the
    rows of pieces served by more than one holder."""
    queue = PieceQueue(Geometry(50, 10, 2), 30, waits=False)
    incarnation = [0, 0, 0]
    held: dict[int, list[tuple[int, int]]] = {0: [], 1: [], 2: []}
    served: dict[tuple[int, int], int] = {}
    for worker, move in moves:
        inc = incarnation[worker]
        if move == "t":
            key = queue.take(worker, inc, 1)
            if isinstance(key, tuple):
                held[worker].append(key)
        elif move == "s" and held[worker]:
            key = held[worker].pop(0)
            queue.start(worker, inc, key)
            served[key] = served.get(key, 0) + 1
            queue.finish(worker, inc, key)
        elif move in "lx":
            started = [k for k, lease in queue.leases.items() if lease.worker == worker]
            assert all(not queue.leases[k].started for k in started)
            (queue.leave(worker, inc) if move == "l" else queue.lost(worker, inc + 1))
            held[worker], incarnation[worker] = [], inc + (move == "x")
    for worker in range(3):  # the survivors give back what they hold, then drain
        queue.leave(worker, incarnation[worker])
    for epoch in range(2):
        for key in drain(queue, [0], epoch):
            served[key] = served.get(key, 0) + 1
    assert queue.epoch_rows == [50, 50]
    assert set(served) == {(e, p) for e in range(2) for p in range(5)}
    assert queue.rows_trained_twice == 0  # pieces were finished as soon as served


def test_a_served_piece_of_a_dead_member_counts_its_rows_twice_exactly() -> None:
    queue = PieceQueue(Geometry(40, 10, 1), 30, waits=False)
    keys = [queue.take(w, 0, 0) for w in (0, 1, 2)]
    for worker, key in zip((0, 1, 2), keys, strict=True):
        assert isinstance(key, tuple)
        queue.start(worker, 0, key)
    queue.lost(0)
    queue.lost(1)
    queue.finish(2, 0, keys[2])  # type: ignore[arg-type]
    drain(queue, [2], 0)
    assert queue.rows_trained_twice == 20 and queue.epoch_rows == [40]


def test_the_messages_round_trip_and_refuse_what_is_out_of_the_cut() -> None:
    take = Take(worker=3, incarnation=1, seq=7, epoch=1, geometry=CUT, started=(1, 4))
    assert Take.from_header(take.header()) == take
    dealt = Dealt(seq=7, piece=(1, 5))
    assert Dealt.from_header(dealt.header()) == dealt
    assert Dealt.from_header(Dealt(seq=8, wait=True).header()).wait
    for field, value in (
        ("cut", [100, 0, 2]),
        ("cut", [1 << 40, 1, 2]),  # more pieces than the queue holds
        ("started", [2, 0]),  # an epoch past the cut
        ("finished", [0, 10]),  # a piece past it
        ("returned", "0,1"),
    ):
        with pytest.raises(ProtocolError, match=field):
            Take.from_header({**take.header(), field: value})


def test_a_checkpointed_cursor_resumes_mid_epoch_with_what_was_done() -> None:
    queue = PieceQueue(Geometry(60, 10, 2), 30, waits=False)
    done = [queue.take(0, 0, 0) for _ in range(4)]
    for key in done[:3]:
        assert isinstance(key, tuple)
        queue.start(0, 0, key)
        queue.finish(0, 0, key)  # the fourth is held when the checkpoint is taken
    saved = json.loads(json.dumps(queue.cursor()))  # as a checkpoint's metadata holds it
    resumed = PieceQueue(Geometry(60, 10, 2), 30, waits=False)
    resumed.restore(parse_cursor(saved))
    rest = drain(resumed, [5], 0)
    assert sorted(rest) == [(0, 3), (0, 4), (0, 5)]  # the held one is dealt again
    assert resumed.epoch_rows == [60, 0]
    assert drain(resumed, [5], 1) == [(1, p) for p in range(6)]


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("cut", [60, 0, 2], "no valid cut"),
        ("frontier", 5, "no valid frontier"),
        ("epoch_rows", [1], "row count for each epoch"),
        ("done", {"0": "not base64!"}, "epoch '0'"),
        ("done", {"0": "AAAA"}, "not of its cut"),  # 3 bytes for 6 pieces
        ("rows_trained_twice", -1, "a count that is not one"),
    ],
)
def test_a_bad_cursor_in_a_checkpoint_is_one_error_saying_what(
    field: str, value: object, says: str
) -> None:
    queue = PieceQueue(Geometry(60, 10, 2), 30, waits=False)
    saved = {**queue.cursor(), field: value}
    with pytest.raises(ValueError, match=says):
        parse_cursor(saved)
    with pytest.raises(ValueError, match="must be a map"):
        parse_cursor([saved])


def test_a_piece_finished_after_a_failover_restored_it_pending_is_not_dealt_again() -> None:
    queue = PieceQueue(Geometry(30, 10, 1), 30, waits=False)
    held = queue.take(0, 0, 0)
    assert isinstance(held, tuple)
    queue.start(0, 0, held)
    promoted = PieceQueue(Geometry(30, 10, 1), 30, waits=False)  # the backup's, from a copy
    promoted.restore(parse_cursor(queue.cursor()))
    promoted.finish(0, 0, held)  # its holder finishes it against the new primary
    assert held not in drain(promoted, [1], 0)
    assert promoted.epoch_rows == [30] and promoted.rows_trained_twice == 0


def test_a_piece_given_back_half_trained_is_dealt_again_and_counted_twice() -> None:
    queue = PieceQueue(CUT, 30, waits=False)
    started, ahead = queue.take(0, 0, 0), queue.take(0, 0, 0)
    assert isinstance(started, tuple) and isinstance(ahead, tuple)
    queue.start(0, 0, started)
    queue.give_back(0, 0, ahead)  # never served: back as it was
    queue.give_back(0, 0, started)  # left inside it: some of its rows were trained
    assert queue.reissued == 1 and not queue.leases
    again = drain(queue, [1], 0)
    assert started in again and ahead in again and len(again) == 10
    assert queue.epoch_rows == [100, 0] and queue.rows_trained_twice == 10


@pytest.mark.parametrize(
    ("batches", "members", "per_piece"),
    [(10, 2, 1), (937, 4, 16), (937, 16, 7), (100, 1, 12), (0, 3, 1)],
)
def test_a_piece_holds_batches_enough_to_leave_each_member_eight(
    batches: int, members: int, per_piece: int
) -> None:
    from ember.worker.pieces import piece_batches

    assert piece_batches(batches, members) == per_piece
    if per_piece > 1:  # at MAX members, each still gets 8 pieces an epoch or more
        assert batches // per_piece >= 8 * members


def test_a_members_piece_is_cut_into_batches_the_last_taking_the_rows_left() -> None:
    import numpy as np

    from ember.data.batches import MemoryBatches
    from ember.worker.pieces import MemoryPieces, PieceSource

    rows = 1004  # 100 batches of 10: 8 pieces of 12 batches for 1 member, the last of 164 rows
    x = np.arange(rows, dtype=np.float32).reshape(rows, 1)
    memory = MemoryBatches(x, np.zeros(rows, np.int64), 10, seed=0, rank=0)
    pieces = MemoryPieces(memory, seed=0)
    source = PieceSource(pieces, 2, 1, "tcp://127.0.0.1:1", b"k" * 32, (0, 0), 5.0, 5.0)
    assert source.geometry == Geometry(rows=1004, piece_rows=120, epochs=2)
    assert source.steps_per_epoch == 100
    for epoch in range(2):
        seen = []
        for piece in range(source.geometry.pieces):
            batches = [batch() for batch in pieces.cut((epoch, piece), source.geometry)]
            sizes = [len(targets) for _, targets in batches]
            assert sizes == ([10] * 12 if piece < 7 else [10] * 15 + [14])
            seen += [int(v) for inputs, _ in batches for v in inputs[:, 0]]
        assert sorted(seen) == list(range(rows))  # each row in one piece, once
        assert seen != list(range(rows))  # in the epoch's seeded order


def write_numbered_rows(path: Path, rows: int, group: int) -> None:
    """A Parquet file whose row i has features [i, i] and label i % 3, in row groups."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    x = np.repeat(np.arange(rows, dtype=np.float32)[:, None], 2, axis=1)
    table = pa.table({"features": pa.array(list(x), pa.list_(pa.float32())),
                      "label": pa.array(np.arange(rows) % 3)})  # fmt: skip
    pq.write_table(table, path, row_group_size=group)


@pytest.mark.parametrize(
    ("group", "members", "piece_rows"),
    [(200, 1, 200), (5000, 3, 200), (9, 2, 160)],
    ids=["a-row-group-a-piece", "8-pieces-a-member", "a-dealing's-least"],
)
def test_a_streamed_epoch_is_dealt_as_pieces_that_read_every_row_once(
    tmp_path: Path, group: int, members: int, piece_rows: int
) -> None:
    """5003 rows in batches of 10. A piece is a row group where that is neither smaller
    than the rows-in-memory cut (160 rows, 16 batches) nor so big that a member gets fewer
    than 8 pieces an epoch (5003 // 24: 200 rows at 3 members). Each epoch's pieces hold
    every row once, shuffled, in batches of 10 but the last of each piece, which takes the
    rows left over."""
    from ember.data.stream import plan_files
    from ember.worker.streamed import StreamedPieces

    rows = 5003
    write_numbered_rows(tmp_path / "rows.parquet", rows, group)
    streamed = StreamedPieces(plan_files(tmp_path / "rows.parquet"), 10, seed=4)
    assert streamed.piece_rows(members) == piece_rows
    cut = Geometry(rows, piece_rows, 2)
    orders = []
    for epoch in range(2):
        seen = []
        for piece in range(cut.pieces):
            batches = [batch() for batch in streamed.cut((epoch, piece), cut)]
            sizes = [len(targets) for _, targets in batches]
            assert sum(sizes) == cut.rows_of(piece)
            assert all(size == 10 for size in sizes[:-1]) and 10 <= sizes[-1] < 20
            for inputs, targets in batches:
                assert (targets == inputs[:, 0].long() % 3).all()  # rows stay whole
                seen += [int(v) for v in inputs[:, 1]]
        assert sorted(seen) == list(range(rows))  # each row in one piece, once
        assert seen != list(range(rows))
        orders.append(seen)
    assert orders[0] != orders[1]  # a fresh arrangement each epoch
    again = StreamedPieces(plan_files(tmp_path / "rows.parquet"), 10, seed=4)
    first = [batch()[1].tolist() for batch in again.cut((1, 0), cut)]
    assert first == [batch()[1].tolist() for batch in streamed.cut((1, 0), cut)]  # seeded
    assert streamed.counters.rows_read >= rows


def test_a_member_reading_a_laid_out_copy_cuts_the_pieces_as_one_reading_the_files(
    tmp_path: Path,
) -> None:
    """The local engine decodes Parquet once into .npy windows; a joiner or a Spark task
    reads the Parquet files. With the files' row groups given, both deal the same rows."""
    from ember.data.stream import plan_files
    from ember.data.streamhost import _lay_out
    from ember.worker.streamed import StreamedPieces

    write_numbered_rows(tmp_path / "rows.parquet", 3001, 170)
    plan = plan_files(tmp_path / "rows.parquet")
    (tmp_path / "copy").mkdir()
    copy = _lay_out(plan, tmp_path / "copy")
    assert [p.rows for p in copy.pieces] != [p.rows for p in plan.pieces]
    files = StreamedPieces(plan, 10, seed=1)
    laid_out = StreamedPieces(copy, 10, seed=1, groups=tuple(p.rows for p in plan.pieces))
    assert laid_out.piece_rows(2) == files.piece_rows(2) == 170 // 10 * 10
    cut = Geometry(3001, files.piece_rows(2), 1)
    for piece in range(cut.pieces):
        ours = [b()[0][:, 0].tolist() for b in laid_out.cut((0, piece), cut)]
        assert ours == [b()[0][:, 0].tolist() for b in files.cut((0, piece), cut)]


def test_a_dead_members_piece_counts_the_rows_its_folded_steps_trained() -> None:
    """The holder said its step and batch size when it started the piece, and the clock
    table says its steps folded: a piece of 10 rows started at step 10 by a member of batch
    2 that died with step 12 folded had 4 rows trained, whether its first push of the piece
    was folded before its word that it started it (the two travel on two connections) or
    after; one that did not say its step counts the whole piece, an upper bound."""
    folded = {1: 11, 2: 0, 3: 10}  # worker 1's first push of the piece is folded already
    queue = PieceQueue(CUT, lease_seconds=60, waits=True)
    queue.steps_of = folded.get
    first, second, third = (queue.take(w, 0, 0) for w in (1, 2, 3))
    assert isinstance(first, tuple) and isinstance(second, tuple) and isinstance(third, tuple)
    queue.start(1, 0, first, step=10, batch=2)
    queue.start(1, 0, first, step=11, batch=2)  # said again: the first word stands
    queue.start(2, 0, second, batch=2)
    queue.start(3, 0, third, step=10, batch=2)
    folded[1], folded[2], folded[3] = 12, 3, 11
    for worker in (1, 2, 3):
        queue.lost(worker)
    again = [queue.take(4, 0, 0) for _ in range(3)]
    assert sorted(again) == sorted([first, second, third])  # dealt again at once
    assert queue.rows_trained_twice == 4 + 10 + 2
    assert queue.reissued == 3


def test_a_pieces_last_batch_counts_the_rows_left_over_with_it() -> None:
    """Batches of 4 cut a 10-row piece into 4 and 6 rows: one step counts 4, two the 10."""
    for steps, rows in ((1, 4), (2, 10)):
        queue = PieceQueue(CUT, lease_seconds=60, waits=True)
        queue.steps_of = lambda worker, steps=steps: steps
        piece = queue.take(1, 0, 0)
        assert isinstance(piece, tuple)
        queue.start(1, 0, piece, step=0, batch=4)
        queue.lost(1)
        assert queue.take(2, 0, 0) == piece
        assert queue.rows_trained_twice == rows


def test_a_holder_whose_lease_ran_out_but_finishes_after_all_counts_its_whole_piece() -> None:
    """A silent holder's lease runs out with one of its five steps folded (2 rows); the
    piece is dealt to another, and then the first finishes it: both trained all 10 rows."""
    queue = PieceQueue(CUT, lease_seconds=5, waits=True)
    queue.steps_of = lambda worker: 1
    piece = queue.take(1, 0, 0)
    assert isinstance(piece, tuple)
    queue.start(1, 0, piece, step=0, batch=2)
    queue.expire(now=time.monotonic() + 10)
    assert queue.take(2, 0, 0) == piece
    assert queue.rows_trained_twice == 2
    queue.finish(1, 0, piece)
    queue.finish(1, 0, piece)  # said twice: counted once
    assert queue.rows_trained_twice == 10
    queue.finish(2, 0, piece)
    assert queue.epoch_rows[0] == 10 and queue.rows_trained_twice == 10


def test_a_live_member_giving_back_a_started_piece_counts_up_to_the_step_it_says() -> None:
    """A member leaving an epoch inside a piece says its step: its pushes of the piece may
    not be folded yet, but the rows it trained count (batch 2, steps 5 to 7: 4 rows)."""
    queue = PieceQueue(CUT, lease_seconds=60, waits=True)
    queue.steps_of = lambda worker: 5
    piece = queue.take(1, 0, 0)
    assert isinstance(piece, tuple)
    queue.start(1, 0, piece, step=5, batch=2)
    queue.give_back(1, 0, piece, step=7)
    assert queue.take(2, 0, 0) == piece
    assert (queue.rows_trained_twice, queue.reissued) == (4, 1)


def test_a_piece_request_says_its_batch_size_within_the_cut_and_its_step() -> None:
    request = Take(worker=1, incarnation=0, seq=1, epoch=0, geometry=CUT, batch=4, step=9)
    read = Take.from_header(request.header())
    assert (read.batch, read.step) == (4, 9)
    for name, bad in [("batch", 0), ("batch", CUT.piece_rows + 1), ("batch", "4")]:
        with pytest.raises(ProtocolError, match=name):
            Take.from_header({**request.header(), name: bad})
    for bad in (-1, (1 << 53) + 1, 2.0, True, None):
        with pytest.raises(ProtocolError, match="step"):
            Take.from_header({**request.header(), "step": bad})
    silent = {k: v for k, v in request.header().items() if k not in ("batch", "step")}
    assert (Take.from_header(silent).batch, Take.from_header(silent).step) == (0, None)
