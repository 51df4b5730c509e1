"""--data-mode on the local engine's launcher: what it streams, what it holds, what it says."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from ember.config import RunConfig
from ember.data import streamhost
from ember.data.generate import generate
from ember.data.streamhost import StreamedDataset, StreamFiles, host_run_data
from ember.errors import ConfigError
from ember.worker.data import shard_batches
from ember.worker.spec import WorkerSpec


@pytest.fixture(scope="module")
def parquet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gen") / "lr"
    written = generate("synthetic-lr", 400_000, out, features=16, row_group_bytes=20_000)
    assert (written.train_rows, written.test_rows) == (5555, 555)
    assert written.row_groups == 21  # 277 rows to a group
    return out


def config(data: Path | str, mode: str, **fields: object) -> RunConfig:
    return RunConfig(data=str(data), data_mode=mode, workers=2, batch_size=32, **fields).validate()


def test_stream_mode_plans_the_training_rows_and_holds_the_test_split(parquet: Path) -> None:
    said: list[str] = []
    host = host_run_data(config(parquet, "stream"), said.append)
    try:
        files = host.files
        assert isinstance(files, StreamFiles) and files.plan is not None
        assert (files.train_rows, files.test_rows, files.input_shape) == (5555, 555, (16,))
        assert set(files.arrays) == {"x_test", "y_test"}  # no training row is held
        # the row groups were decoded once into .npy files on disk, streamed in windows
        assert host.scratch is not None and not str(host.scratch).startswith("/dev/shm")
        assert {p.kind for p in files.plan.pieces} == {"npy"}
        assert (host.scratch / "x_train.npy").stat().st_size > 5555 * 16 * 4
        assert said == [
            f"ember: streaming {parquet} from a copy decoded once into {host.scratch}"
            " (0.0 GiB; removed when the run ends)"
        ]
        dataset = files.shard(1, 2)
        assert isinstance(dataset, StreamedDataset) and len(dataset.x_train) == 0
        assert dataset.x_test.shape == (555, 16)
        spec = WorkerSpec(config(parquet, "stream"), 1, 2, own_rows=True)
        batches = shard_batches(spec, dataset)
        assert batches.rows == 5555 // 2
        assert sum(len(y) for _, y in batches.epoch(0)) == 5555 // 2 // 32 * 32
    finally:
        host.close()
    assert host.scratch is None


def test_memory_mode_lays_the_same_file_out_to_map(parquet: Path) -> None:
    host = host_run_data(config(parquet, "memory"), print)
    try:
        assert not isinstance(host.files, StreamFiles) and host.files.train_rows == 5555
    finally:
        host.close()


def test_auto_streams_data_bigger_than_its_share_of_memory_and_says_so_in_one_line(
    parquet: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    said: list[str] = []
    host = host_run_data(config(parquet, "auto"), said.append)
    host.close()
    assert not isinstance(host.files, StreamFiles) and said == []
    monkeypatch.setattr(streamhost, "AUTO_FRACTION", 10**9)  # any data is then too big
    for data in (parquet, "digits"):
        host = host_run_data(config(data, "auto"), said.append)
        host.close()
        assert isinstance(host.files, StreamFiles)
    assert len(said) == 3 and said[0].startswith(f"ember: data mode auto: streaming {parquet}")
    assert "GiB of memory)" in said[0] and said[1].startswith(f"ember: streaming {parquet} from")


def test_without_room_on_disk_for_a_decoded_copy_the_row_groups_stream_in_place(
    parquet: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(streamhost, "_disk_room", lambda needed: False)
    said: list[str] = []
    host = host_run_data(config(parquet, "stream"), said.append)
    try:
        files = host.files
        assert isinstance(files, StreamFiles) and files.plan is not None
        assert {p.kind for p in files.plan.pieces} == {"parquet"} and said == []
        batches = shard_batches(WorkerSpec(config(parquet, "stream"), 0, 2), files.shard(0, 2))
        assert sum(len(y) for _, y in batches.epoch(0)) == 5555 // 2 // 32 * 32
    finally:
        host.close()


def test_a_named_dataset_streams_from_the_files_it_is_laid_out_in() -> None:
    host = host_run_data(config("digits", "stream"), print)
    try:
        assert isinstance(host.files, StreamFiles) and host.files.train_rows == 10_000
        plan = host.files.plan
        assert plan is not None and plan.pieces[0].kind == "npy" and plan.rows == 10_000
    finally:
        host.close()


def test_a_folder_of_npz_shards_in_memory_mode_is_refused_with_the_way_out(
    tmp_path: Path,
) -> None:
    x = np.zeros((40, 3), dtype=np.float32)
    np.savez(tmp_path / "shard-0.npz", x=x, y=np.arange(40) % 2)
    with pytest.raises(ConfigError, match="only streamed; pass --data-mode stream or auto"):
        host_run_data(config(tmp_path, "memory"), print)


def test_auto_leaves_files_it_cannot_plan_to_the_loader_and_its_whole_error(
    tmp_path: Path,
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.unit.test_data import SPARK_VECTORS

    path = tmp_path / "vectors.parquet"
    pq.write_table(pa.table({"features": SPARK_VECTORS, "label": [0, 1]}), path)
    with pytest.raises(ConfigError, match="it holds Spark ML vectors"):
        host_run_data(config(path, "auto"), print)
    with pytest.raises(ConfigError, match=r"row group 0: column 'features' must be a list.*vec"):
        host_run_data(config(path, "stream"), print)


def values_parquet(folder: Path, outputs: int) -> Path:
    """Rows whose targets are values: a number a row, or a list of `outputs` numbers, each
    a row's id plus (k + 1)/10 so that a batch says which rows and outputs it holds."""
    folder.mkdir()
    ids = np.arange(1000, dtype=np.float32)
    x = np.repeat(ids[:, None], 4, axis=1)
    y = ids[:, None] + np.arange(1, outputs + 1, dtype=np.float32) / 10
    label = pa.array(list(y), type=pa.list_(pa.float32())) if outputs > 1 else pa.array(y[:, 0])
    table = pa.table({"features": pa.array(list(x), type=pa.list_(pa.float32())), "label": label})
    pq.write_table(table.slice(0, 900), folder / "train.parquet", row_group_size=100)
    pq.write_table(table.slice(900), folder / "test.parquet")
    return folder


@pytest.mark.parametrize("outputs", [1, 3])
def test_values_stream_with_their_rows_for_a_loss_on_values(tmp_path: Path, outputs: int) -> None:
    data = values_parquet(tmp_path / "values", outputs)
    run = config(data, "stream", loss="mse")
    host = host_run_data(run, print)
    try:
        files = host.files
        assert isinstance(files, StreamFiles) and files.plan is not None
        assert files.plan.targets == "values" and files.num_classes == outputs
        dataset = files.shard(0, 2)
        shape = (outputs,) if outputs > 1 else ()
        assert dataset.y_test.dtype == np.float32 and dataset.y_test.shape == (100, *shape)
        spec = WorkerSpec(run, 0, 2, own_rows=True)
        seen = []
        for x, y in shard_batches(spec, dataset).epoch(0):
            assert y.dtype == torch.float32 and tuple(y.shape[1:]) == shape
            ids = x[:, 0].numpy()
            expected = ids[:, None] + np.arange(1, outputs + 1) / 10
            assert np.allclose(y.numpy().reshape(len(ids), -1), expected)  # each row's own
            seen.append(ids)
        assert len(np.unique(np.concatenate(seen))) == 900 // 2 // 32 * 32
    finally:
        host.close()


def test_float_labels_under_a_class_loss_stream_as_one_error_naming_the_row_group(
    tmp_path: Path,
) -> None:
    data = values_parquet(tmp_path / "values", 1)
    # 0.1-steps are not classes: the planner reads the first row group and says so
    with pytest.raises(ConfigError, match=r"train.parquet.*label"):
        host = host_run_data(config(data, "stream"), print)
        host.close()
