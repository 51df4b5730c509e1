"""`ember data generate`: synthetic Parquet datasets of a given size, in row groups, laid out
as train.parquet and test.parquet, which load_dataset reads as its own split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from ember.cli import main
from ember.data import load_dataset
from ember.data.generate import generate, parse_size
from ember.errors import ConfigError


def test_synthetic_lr_of_a_size_is_written_in_row_groups_load_dataset_reads(
    tmp_path: Path,
) -> None:
    out = tmp_path / "lr"
    written = generate("synthetic-lr", 1_000_000, out, features=32, row_group_bytes=50_000)
    assert (written.train_rows, written.test_rows, written.row_groups) == (7352, 735, 21)
    train = pq.ParquetFile(out / "train.parquet").metadata
    assert train.num_rows == 7352 and train.num_row_groups == 21
    data = load_dataset(str(out))
    assert data.x_train.shape == (7352, 32) and data.x_test.shape == (735, 32)
    assert not data.held_out and data.num_classes == 2
    assert 0.2 < data.y_train.mean() < 0.8  # both classes, from the logistic model


def test_mnist_like_images_have_ten_classes_of_784_pixels(tmp_path: Path) -> None:
    assert main(["data", "generate", "--kind", "mnist-like", "--size", "2MB", "--out",
                 str(tmp_path / "m")]) == 0  # fmt: skip
    data = load_dataset(str(tmp_path / "m"))
    assert data.input_shape == (784,) and data.num_classes == 10
    assert len(np.unique(data.y_train)) == 10


def test_sizes_take_units_and_refuse_nonsense() -> None:
    assert parse_size("4GB") == 4 * 10**9 and parse_size("512MiB") == 512 << 20
    with pytest.raises(ConfigError, match="size must be a number and a unit"):
        parse_size("4 furlongs")


def test_generate_refuses_a_folder_that_holds_files_and_an_unknown_kind(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="exists and is not empty"):
        generate("mnist-like", 10_000, tmp_path)
    with pytest.raises(ConfigError, match="kind must be one of synthetic-lr, mnist-like, mnist"):
        generate("imagenet", 10_000, tmp_path / "new")
