"""One copy of the data per host: the IDX cache, the files a run writes once, and the shards
workers map of them (their own rows only, read-only)."""

from __future__ import annotations

import mmap
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from ember.config import RunConfig
from ember.data import load_dataset, shard_indices
from ember.data.cache import cached_idx
from ember.data.host import host_data
from ember.data.idx import IDX_FILES, MNIST_DIR
from ember.data.store import ArrayFile, DataFiles, write_files
from ember.errors import ConfigError
from ember.worker.data import shard_batches
from ember.worker.spec import WorkerSpec

SPLITS = ("x_train", "y_train", "x_test", "y_test")


def idx_copy(folder: Path) -> Path:
    """An IDX folder of its own holding the vendored MNIST files."""
    folder.mkdir()
    for name in IDX_FILES.values():
        shutil.copy(MNIST_DIR / f"{name}.gz", folder / f"{name}.gz")
    return folder


def same(a: object, b: object) -> bool:
    return all(np.array_equal(getattr(a, k), getattr(b, k)) for k in SPLITS)


def test_an_idx_folder_is_decoded_once_and_again_only_when_a_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    folder = idx_copy(tmp_path / "idx")
    first = cached_idx(folder)
    assert first is not None
    entry = Path(first.arrays["x_train"].path).parent
    assert entry.parent == tmp_path / "cache" and same(first.dataset(), load_dataset("mnist"))
    again = cached_idx(folder)
    assert again is not None and again.arrays == first.arrays  # the same files, not rewritten
    labels = folder / "t10k-labels-idx1-ubyte.gz"
    labels.unlink()
    shutil.copy(MNIST_DIR / "train-labels-idx1-ubyte.gz", labels)  # other bytes, same name
    with pytest.raises(ConfigError, match="has 60000 labels but"):
        cached_idx(folder)
    shutil.copy(MNIST_DIR / "t10k-labels-idx1-ubyte.gz", labels)  # back, with a new mtime
    rebuilt = cached_idx(folder)
    assert rebuilt is not None and rebuilt.arrays != first.arrays
    # the entry of the older contents is gone: the cache holds one entry per folder
    assert not entry.exists() and Path(rebuilt.arrays["x_train"].path).parent.is_dir()


def test_a_damaged_cache_entry_is_decoded_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    folder = idx_copy(tmp_path / "idx")
    files = cached_idx(folder)
    assert files is not None
    x_train = Path(files.arrays["x_train"].path)
    x_train.write_bytes(x_train.read_bytes()[:-4096])  # a disk that filled up
    repaired = cached_idx(folder)
    assert repaired is not None and same(repaired.dataset(), load_dataset("mnist"))


def test_without_a_writable_cache_mnist_is_still_decoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("EMBER_CACHE_DIR", str(blocker / "cache"))  # under a file: unwritable
    assert cached_idx(MNIST_DIR) is None
    digits = load_dataset("digits")
    assert digits.x_train.shape == (10_000, 1, 28, 28) and not isinstance(digits.x_train, np.memmap)


def test_array_files_refuse_a_length_their_header_does_not_announce(tmp_path: Path) -> None:
    path = tmp_path / "a.npy"
    np.save(path, np.arange(12, dtype=np.float32).reshape(3, 4))
    assert ArrayFile.open(path).shape == (3, 4)
    path.write_bytes(path.read_bytes() + b"\0" * 4)
    with pytest.raises(ConfigError, match=f"^array file {path}: has .* bytes, its header says"):
        ArrayFile.open(path)


@pytest.mark.parametrize("samples", [1_000, 300_001])
def test_synthetic_lr_written_block_by_block_is_load_datasets_data(samples: int) -> None:
    host = host_data("synthetic-lr", seed=7, synthetic_samples=samples, synthetic_features=9)
    try:
        expected = load_dataset(
            "synthetic-lr", seed=7, synthetic_samples=samples, synthetic_features=9
        )
        data = host.files.dataset()
        assert same(data, expected) and data.num_classes == 2 and data.input_shape == (9,)
    finally:
        scratch = host.scratch
        host.close()
    assert scratch is not None and not scratch.exists()


def test_a_users_npz_is_read_once_into_files_every_process_maps(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((500, 3)), rng.integers(0, 4, 500)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    host = host_data(str(tmp_path / "d.npz"), seed=0, synthetic_samples=1, synthetic_features=1)
    try:
        assert same(host.files.dataset(), load_dataset(str(tmp_path / "d.npz")))
        assert host.files.name == str(tmp_path / "d.npz") and host.files.num_classes == 4
    finally:
        host.close()


def test_the_test_set_read_in_windows_is_the_mapped_test_set(tmp_path: Path) -> None:
    host = host_data("synthetic-lr", seed=1, synthetic_samples=3000, synthetic_features=7)
    try:
        mapped = host.files.dataset()
        windows = list(host.files.test_batches(128))
        rows = len(mapped.y_test)
        assert rows % 128 != 0  # so that the last window is a short one
        assert [len(y) for _, y in windows] == [128] * (rows // 128) + [rows % 128]
        for part, name in ((0, "x_test"), (1, "y_test")):
            read = np.concatenate([w[part] for w in windows])
            assert read.dtype == getattr(mapped, name).dtype
            assert np.array_equal(read, getattr(mapped, name))
            assert not isinstance(windows[0][part], np.memmap)  # read in, not mapped
        with pytest.raises(ConfigError, match=rf"rows \[0, {rows + 1}\) out of range"):
            host.files.arrays["y_test"].read(0, rows + 1)
    finally:
        host.close()


def mapped_bytes(array: np.ndarray) -> int:
    """How many bytes of its file a memmap (or a view of one) has mapped."""
    while not isinstance(getattr(array, "_mmap", None), mmap.mmap):
        array = array.base  # type: ignore[assignment]
    return len(array._mmap)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("rank", "world"), [(0, 2), (1, 2), (2, 3)])
def test_a_worker_maps_exactly_its_shard_read_only_and_nothing_of_the_others(
    tmp_path: Path, rank: int, world: int
) -> None:
    full = load_dataset("synthetic-lr", seed=1, synthetic_samples=30_001, synthetic_features=40)
    files = write_files(full, tmp_path / "data")
    rows = shard_indices(len(full.x_train), rank, world)
    shard = files.shard(rank, world)
    np.testing.assert_array_equal(shard.x_train, full.x_train[rows])
    np.testing.assert_array_equal(shard.y_train, full.y_train[rows])
    np.testing.assert_array_equal(shard.x_test, full.x_test)
    row_bytes = full.x_train[0].nbytes
    # the mapping starts at most a page before the shard and ends where it ends
    shard_bytes, page = len(rows) * row_bytes, mmap.ALLOCATIONGRANULARITY
    assert shard_bytes <= mapped_bytes(shard.x_train) < shard_bytes + page
    assert not shard.x_train.flags.writeable and not shard.y_train.flags.writeable
    # the worker trains on the mapping itself: no copy of its rows, let alone of others'
    config = RunConfig(strategy="async", workers=world, batch_size=64).validate()
    batches = shard_batches(WorkerSpec(config, rank, world, own_rows=True), shard)
    features, labels = batches.features, batches.targets  # type: ignore[attr-defined]
    assert np.shares_memory(features.numpy(), shard.x_train) and len(features) == len(rows)
    assert np.shares_memory(labels.numpy(), shard.y_train)
    assert torch.equal(features, torch.from_numpy(full.x_train[rows]))


def test_a_shard_beyond_the_rows_is_refused(tmp_path: Path) -> None:
    full = load_dataset("synthetic-lr", seed=1, synthetic_samples=100, synthetic_features=2)
    files = write_files(full, tmp_path / "data")
    with pytest.raises(ConfigError, match="rank must be in"):
        files.shard(2, 2)
    with pytest.raises(ConfigError, match="unreadable"):
        DataFiles.open(tmp_path / "nowhere")


def test_scratch_folders_of_launchers_that_died_are_removed(tmp_path: Path) -> None:
    host = host_data("synthetic-lr", seed=0, synthetic_samples=50, synthetic_features=2)
    try:
        assert host.scratch is not None
        dead = host.scratch.parent / "ember-data-999999999-x"
        dead.mkdir()
        mine = host.scratch.parent / f"ember-data-{os.getpid()}-y"
        mine.mkdir()
        second = host_data("synthetic-lr", seed=0, synthetic_samples=50, synthetic_features=2)
        second.close()
        assert not dead.exists() and mine.exists()
        mine.rmdir()
    finally:
        host.close()
