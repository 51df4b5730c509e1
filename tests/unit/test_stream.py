"""Streaming a worker's shard from disk: the plan of pieces and its split among workers, the
epochs' batches (every row once, a new order each time, resumable), and the one clear error a
file broken mid-stream gets."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ember.data.batches import MemoryBatches
from ember.data.store import write_array
from ember.data.stream import StreamPlan, plan_files, plan_npy, read_piece
from ember.data.streaming import ShufflePool, StreamBatches
from ember.errors import ConfigError


def rows_table(ids: np.ndarray, width: int = 4) -> pa.Table:
    """Rows whose first feature is their id, so a batch says which rows it holds."""
    x = np.zeros((len(ids), width), dtype=np.float32)
    x[:, 0] = ids
    features = pa.array(list(x), type=pa.list_(pa.float32()))
    return pa.table({"features": features, "label": (ids % 3).astype(np.int64)})


def write_parquet(path: Path, ids: np.ndarray, group: int, width: int = 4) -> Path:
    pq.write_table(rows_table(ids, width), path, row_group_size=group)
    return path


def ids_of(plan: StreamPlan, pieces: tuple = ()) -> np.ndarray:
    read = [read_piece(p)[0][:, 0] for p in (pieces or plan.pieces)]
    return np.concatenate(read).astype(np.int64)


def epoch_ids(batches: StreamBatches | MemoryBatches, epoch: int, start: int = 0) -> np.ndarray:
    return np.concatenate([x[:, 0].numpy() for x, _ in batches.epoch(epoch, start)]).astype(int)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """Two Parquet files of 1000 and 700 rows, row groups of 100 rows."""
    data = tmp_path / "data"
    data.mkdir()
    write_parquet(data / "part-0.parquet", np.arange(1000), 100)
    write_parquet(data / "part-1.parquet", np.arange(1000, 1700), 100)
    (data / "_SUCCESS").write_text("")
    return data


def test_a_parquet_folder_is_planned_as_its_row_groups_in_file_order(folder: Path) -> None:
    plan = plan_files(folder)
    assert len(plan.pieces) == 17 and plan.rows == 1700
    assert plan.input_shape == (4,) and plan.num_classes == 3
    assert [p.index for p in plan.pieces[:11]] == [*range(10), 0]
    assert np.array_equal(ids_of(plan), np.arange(1700))
    train, test = plan.split(1530)
    assert np.array_equal(ids_of(train), np.arange(1530))
    assert np.array_equal(ids_of(test), np.arange(1530, 1700))


def test_shards_are_disjoint_equal_and_fixed_by_the_seed(folder: Path) -> None:
    plan = plan_files(folder)
    shards = [ids_of(plan, plan.shard(rank, 3, seed=7)) for rank in range(3)]
    assert [len(s) for s in shards] == [566, 566, 566]
    together = np.concatenate(shards)
    assert len(np.unique(together)) == 1698  # disjoint; the last 1700 % 3 rows dropped
    assert np.array_equal(ids_of(plan, plan.shard(1, 3, seed=7)), shards[1])
    assert not np.array_equal(ids_of(plan, plan.shard(1, 3, seed=8)), shards[1])


def test_every_row_of_a_shard_comes_once_per_epoch_in_a_new_order(folder: Path) -> None:
    plan = plan_files(folder)
    pieces = plan.shard(0, 2, seed=1)
    batches = StreamBatches(pieces, (4,), 3, 50, seed=1, rank=0, shuffle_buffer=300)
    first, second = epoch_ids(batches, 0), epoch_ids(batches, 1)
    shard = ids_of(plan, pieces)
    assert len(first) == len(second) == 850  # 17 whole batches of 50
    assert np.array_equal(np.sort(first), np.sort(shard))
    assert np.array_equal(np.sort(second), np.sort(shard))
    assert not np.array_equal(first, second)
    assert np.array_equal(epoch_ids(batches, 1), second)  # the seed fixes each epoch's order
    assert batches.counters.rows_read == 3 * 850


def test_a_streamed_shard_and_the_same_rows_in_memory_give_the_same_rows_each_epoch(
    folder: Path,
) -> None:
    plan = plan_files(folder)
    pieces = plan.shard(1, 2, seed=0)
    x, y = (np.concatenate(parts) for parts in zip(*map(read_piece, pieces), strict=True))
    memory = MemoryBatches(x, y, 25, seed=0, rank=1)
    streamed = StreamBatches(pieces, (4,), 3, 25, seed=0, rank=1, shuffle_buffer=10_000)
    for epoch in range(2):
        assert np.array_equal(
            np.sort(epoch_ids(memory, epoch)), np.sort(epoch_ids(streamed, epoch))
        )


def test_a_resumed_epoch_gives_the_rest_of_the_same_batches(folder: Path) -> None:
    plan = plan_files(folder)
    batches = StreamBatches(plan.pieces, (4,), 3, 64, seed=3, rank=0, shuffle_buffer=200)
    whole = epoch_ids(batches, 2)
    assert np.array_equal(epoch_ids(batches, 2, start=10), whole[10 * 64 :])


def test_rows_are_mixed_across_pieces_within_the_shuffle_buffer(folder: Path) -> None:
    plan = plan_files(folder)
    batches = StreamBatches(plan.pieces, (4,), 3, 100, seed=0, rank=0, shuffle_buffer=1000)
    first = next(iter(batches.epoch(0)))[0][:, 0].numpy().astype(int)
    assert len(np.unique(first // 100)) > 3  # rows of several row groups in one batch


def test_the_shuffle_pool_holds_no_more_than_its_capacity() -> None:
    pool = ShufflePool(500, (2,), np.random.default_rng(0))
    out = []
    for start in range(0, 5000, 200):
        ids = np.arange(start, start + 200)
        x = np.stack([ids, ids], axis=1).astype(np.float32)
        out.append(pool.add(x, ids)[1])
        assert pool.held <= 500 and len(pool.y) <= 500
    out.append(pool.drain()[1])
    assert np.array_equal(np.sort(np.concatenate(out)), np.arange(5000))


def test_an_epoch_left_early_stops_its_read_ahead_thread(folder: Path) -> None:
    plan = plan_files(folder)
    batches = StreamBatches(plan.pieces, (4,), 3, 10, seed=0, rank=0, shuffle_buffer=20)
    before = threading.active_count()
    epoch = batches.epoch(0)
    next(epoch)
    assert threading.active_count() == before + 1
    epoch.close()
    assert threading.active_count() == before


def test_a_parquet_file_truncated_mid_stream_is_one_error_naming_it_and_its_row_group(
    folder: Path,
) -> None:
    plan = plan_files(folder)
    victim = folder / "part-1.parquet"
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    batches = StreamBatches(plan.pieces, (4,), 3, 100, seed=0, rank=0, shuffle_buffer=100)
    with pytest.raises(ConfigError, match=rf"data file {victim}, row group \d+: cannot read"):
        epoch_ids(batches, 0)


def test_a_schema_that_changes_mid_stream_is_one_error_naming_the_file_and_row_group(
    folder: Path,
) -> None:
    later = write_parquet(folder / "part-2.parquet", np.arange(1700, 1800), 50, width=5)
    batches = StreamBatches(plan_files(folder).pieces, (4,), 3, 100, 0, 0, 100)
    with pytest.raises(
        ConfigError,
        match=rf"data file {later}, row group \d: rows have shape \(5,\), the rows before had"
        r" \(4,\) \(the schema changed mid-stream\)",
    ):
        epoch_ids(batches, 0)


def test_a_features_column_of_another_type_mid_stream_is_named(folder: Path) -> None:
    later = folder / "part-2.parquet"
    pq.write_table(pa.table({"features": ["a", "b"], "label": [0, 1]}), later)
    batches = StreamBatches(plan_files(folder).pieces, (4,), 3, 100, 0, 0, 100)
    with pytest.raises(
        ConfigError, match=rf"data file {later}, row group 0: column 'features' must be a list"
    ):
        epoch_ids(batches, 0)


def test_a_folder_of_npz_shards_and_a_pair_of_npy_files_stream_alike(tmp_path: Path) -> None:
    shards = tmp_path / "npz"
    shards.mkdir()
    ids = np.arange(300)
    x = np.stack([ids, ids], axis=1).astype(np.float32)
    for i in range(3):
        part = slice(100 * i, 100 * (i + 1))
        np.savez(shards / f"shard-{i}.npz", x=x[part], y=ids[part] % 2)
    npz = plan_files(shards)
    assert npz.rows == 300 and npz.input_shape == (2,) and npz.num_classes == 2
    npy = plan_npy(
        write_array(tmp_path / "x.npy", x), write_array(tmp_path / "y.npy", ids % 2), 300, 2
    )
    for plan in (npz, npy):
        batches = StreamBatches(plan.pieces, (2,), 2, 30, seed=0, rank=0, shuffle_buffer=50)
        assert np.array_equal(np.sort(epoch_ids(batches, 0)), ids)


def test_a_path_that_cannot_be_streamed_says_what_can(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(ConfigError, match=r"cannot be streamed; expected a \.parquet file or a"):
        plan_files(tmp_path)


def id_rows(tmp_path: Path, rows: int, width: int) -> StreamPlan:
    """An .npy pair whose rows hold their number in every feature, labelled number % 2."""
    ids = np.arange(rows)
    x = np.repeat(ids[:, None], width, axis=1).astype(np.float32)
    xs, ys = write_array(tmp_path / "x.npy", x), write_array(tmp_path / "y.npy", ids % 2)
    return plan_npy(xs, ys, rows, 2)


def test_rows_of_one_npy_file_are_gathered_by_number_with_their_own_labels(
    tmp_path: Path,
) -> None:
    plan = id_rows(tmp_path, 3000, 3)
    batches = StreamBatches(plan.pieces, (3,), 2, 40, seed=0, rank=0, shuffle_buffer=500)
    assert batches.mapped is not None  # the one-file case: no copy through the pool
    epochs = []
    for epoch in range(2):
        rows = [(x.numpy(), y.numpy()) for x, y in batches.epoch(epoch)]
        x, y = (np.concatenate(part) for part in zip(*rows, strict=True))
        assert x.dtype == np.float32 and np.array_equal(x[:, 0], x[:, 2])
        assert np.array_equal(y, x[:, 0].astype(np.int64) % 2)  # each row keeps its label
        assert np.array_equal(np.sort(x[:, 0]), np.arange(3000))  # every row once
        epochs.append(x[:, 0])
    assert not np.array_equal(*epochs)
    assert np.array_equal(epoch_ids(batches, 1, start=5), epochs[1][5 * 40 :].astype(int))


def _rss_file() -> int:
    """Bytes of mapped files resident in this process (RssFile)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    pytest.skip("/proc/self/status has no RssFile")


@pytest.mark.parametrize("release", [4 << 20, 1 << 40])
def test_a_mapped_stream_lets_go_of_the_pages_it_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release: int
) -> None:
    import ember.data.store

    monkeypatch.setattr(ember.data.store, "RELEASE_BYTES", release)
    plan = id_rows(tmp_path, 64 * 1024, 256)  # 64 MiB of features, in the page cache
    batches = StreamBatches(plan.pieces, (256,), 2, 256, seed=0, rank=0, shuffle_buffer=2000)
    before = _rss_file()
    assert sum(len(y) for _, y in batches.epoch(0)) == 64 * 1024
    grown = _rss_file() - before
    if release < 64 << 20:
        assert grown < 24 << 20  # a release every 4 MiB: not the file
    else:  # never released: the whole file stays mapped in, which is what the release bounds
        assert grown > 48 << 20
