"""Specification of ember.data: named datasets, user files, their errors and worker shards."""

from __future__ import annotations

import gzip
import hashlib
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.data import DATASET_NAMES, Dataset, load_dataset, read_idx, shard_indices
from ember.data.dataset import IGNORED_CLASS
from ember.data.idx import MNIST_DIR, _load_cached, load_idx_folder
from ember.errors import ConfigError

pytestmark = pytest.mark.timeout(60)

MEAN, STD = 0.1307, 0.3081
IMAGES, LABELS = 0x803, 0x801
UNKNOWN = (
    "data must be one of mnist, digits, synthetic-lr or a path to a .npz, .parquet file or an"
    " MNIST IDX folder; got "
)


@pytest.fixture(scope="module")
def mnist() -> Dataset:
    return load_dataset("mnist")


@pytest.fixture(scope="module")
def raw() -> dict[str, np.ndarray]:
    return load_idx_folder(MNIST_DIR)


def raises(message: str) -> Any:
    """Expect a ConfigError whose whole message is exactly `message`."""
    return pytest.raises(ConfigError, match=f"^{re.escape(message)}$")


# --- MNIST and digits --------------------------------------------------------------------------


def test_dataset_names_are_the_three_documented_names() -> None:
    assert DATASET_NAMES == ("mnist", "digits", "synthetic-lr")


def test_mnist_loads_60000_normalized_training_images(mnist: Dataset) -> None:
    x = mnist.x_train
    assert x.shape == (60000, 1, 28, 28)
    assert x.dtype == np.float32 and x.flags.c_contiguous and x.flags.writeable
    # MNIST's own mean and std were used, so the result is standardized
    assert abs(float(x.mean())) < 1e-3 and abs(float(x.std()) - 1) < 1e-3
    assert x.min() == pytest.approx(-MEAN / STD, abs=1e-5)
    assert x.max() == pytest.approx((1 - MEAN) / STD, abs=1e-5)


def test_mnist_has_10000_test_images_ten_classes_and_the_known_first_labels(
    mnist: Dataset,
) -> None:
    assert mnist.name == "mnist"
    assert mnist.x_test.shape == (10000, 1, 28, 28)
    assert mnist.y_train.shape == (60000,) and mnist.y_train.dtype == np.int64
    assert mnist.num_classes == 10 and mnist.input_shape == (1, 28, 28)
    assert mnist.y_train[:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
    assert mnist.y_test[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    assert (np.bincount(mnist.y_train) > 5000).all()


def test_mnist_pixels_undo_exactly_to_the_raw_idx_bytes(mnist: Dataset, raw: dict) -> None:
    pixels = (mnist.x_test[:, 0].astype(np.float64) * STD + MEAN) * 255
    assert np.abs(pixels - raw["x_test"]).max() < 1e-3
    assert raw["x_test"].dtype == np.uint8 and raw["x_test"].shape == (10000, 28, 28)


def test_vendored_mnist_files_match_their_sha256sums() -> None:
    lines = (MNIST_DIR / "SHA256SUMS").read_text().split("\n")
    sums = dict(reversed(line.split()) for line in lines if line.strip())
    assert len(sums) == 4
    for name, digest in sums.items():
        assert hashlib.sha256((MNIST_DIR / name).read_bytes()).hexdigest() == digest, name


def test_mnist_notice_attributes_lecun_cortes_burges_under_cc_by_sa_3() -> None:
    notice = (MNIST_DIR / "NOTICE.md").read_text()
    for phrase in ("LeCun", "Cortes", "Burges", "CC BY-SA 3.0", "unchanged", "SHA256SUMS"):
        assert phrase in notice


def test_mnist_is_decoded_once_into_the_cache_and_each_caller_owns_its_arrays(
    mnist: Dataset,
) -> None:
    parsed = _load_cached.cache_info()
    first = load_dataset("mnist")
    first.x_train[0] = 99.0
    second = load_dataset("mnist")
    assert _load_cached.cache_info() == parsed  # read from the cache's files, not the gzips
    assert not np.shares_memory(first.x_train, second.x_train)
    assert second.x_train[0].max() < 3 and np.array_equal(second.x_train, mnist.x_train)


def test_digits_is_the_first_10000_training_and_2000_test_mnist_images(mnist: Dataset) -> None:
    digits = load_dataset("digits")
    assert digits.name == "digits" and digits.num_classes == 10
    assert digits.input_shape == (1, 28, 28)
    np.testing.assert_array_equal(digits.x_train, mnist.x_train[:10000])
    np.testing.assert_array_equal(digits.y_train, mnist.y_train[:10000])
    np.testing.assert_array_equal(digits.x_test, mnist.x_test[:2000])
    np.testing.assert_array_equal(digits.y_test, mnist.y_test[:2000])
    assert digits.x_train.flags.c_contiguous and digits.x_train.flags.writeable


# --- IDX folders -------------------------------------------------------------------------------


def write_idx(path: Path, array: np.ndarray, magic: int, gz: bool = False) -> Path:
    header = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in array.shape)
    payload = header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()
    if gz:
        path = path.with_name(path.name + ".gz")
        payload = gzip.compress(payload)
    path.write_bytes(payload)
    return path


def idx_folder(folder: Path, raw: dict, n: int = 100, m: int = 20) -> Path:
    """The first n/m MNIST images as an IDX folder: train files raw, test files gzipped."""
    folder.mkdir(exist_ok=True)
    write_idx(folder / "train-images-idx3-ubyte", raw["x_train"][:n], IMAGES)
    write_idx(folder / "train-labels-idx1-ubyte", raw["y_train"][:n], LABELS)
    write_idx(folder / "t10k-images-idx3-ubyte", raw["x_test"][:m], IMAGES, gz=True)
    write_idx(folder / "t10k-labels-idx1-ubyte", raw["y_test"][:m], LABELS, gz=True)
    return folder


def test_idx_folder_of_raw_and_gzipped_files_loads_like_mnist(
    tmp_path: Path, raw: dict, mnist: Dataset
) -> None:
    data = load_dataset(str(idx_folder(tmp_path / "idx", raw)))
    assert data.name == str(tmp_path / "idx") and data.input_shape == (1, 28, 28)
    np.testing.assert_array_equal(data.x_train, mnist.x_train[:100])
    np.testing.assert_array_equal(data.y_train, mnist.y_train[:100])
    np.testing.assert_array_equal(data.x_test, mnist.x_test[:20])
    assert data.num_classes == int(max(mnist.y_train[:100].max(), mnist.y_test[:20].max())) + 1


def test_idx_file_with_wrong_magic_number_is_named(tmp_path: Path, raw: dict) -> None:
    folder = idx_folder(tmp_path / "idx", raw)
    bad = write_idx(folder / "train-labels-idx1-ubyte", raw["x_train"][:100], IMAGES)
    with raises(
        f"IDX file {bad}: bad magic number 0x00000803, expected 0x00000801 (labels, unsigned bytes)"
    ):
        load_dataset(str(folder))


def test_truncated_idx_file_reports_its_length_and_dims(tmp_path: Path, raw: dict) -> None:
    folder = idx_folder(tmp_path / "idx", raw)
    images = folder / "train-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:-5])
    expected = 16 + 100 * 28 * 28
    with raises(
        f"IDX file {images}: has {expected - 5} bytes, expected {expected} for dims 100x28x28"
    ):
        load_dataset(str(folder))


def test_idx_header_shorter_than_four_bytes_is_reported(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"\x00\x00")
    with raises(f"IDX file {tmp_path / 'f'}: 2 bytes is too short for an IDX header"):
        read_idx(tmp_path / "f", LABELS)


def test_idx_image_and_label_counts_must_match(tmp_path: Path, raw: dict) -> None:
    folder = idx_folder(tmp_path / "idx", raw)
    labels = write_idx(folder / "train-labels-idx1-ubyte", raw["y_train"][:99], LABELS)
    with raises(f"IDX file {labels}: has 99 labels but train-images-idx3-ubyte has 100 images"):
        load_dataset(str(folder))


def test_corrupt_gzip_idx_file_is_named(tmp_path: Path, raw: dict) -> None:
    folder = idx_folder(tmp_path / "idx", raw)
    gz = folder / "t10k-images-idx3-ubyte.gz"
    gz.write_bytes(gz.read_bytes()[:200])
    with pytest.raises(ConfigError, match=f"^IDX file {re.escape(str(gz))}: corrupt gzip data"):
        load_dataset(str(folder))


def test_idx_folder_missing_a_file_names_it(tmp_path: Path, raw: dict) -> None:
    folder = idx_folder(tmp_path / "idx", raw)
    (folder / "t10k-labels-idx1-ubyte.gz").unlink()
    with raises(f"IDX folder {folder}: missing t10k-labels-idx1-ubyte[.gz]"):
        load_dataset(str(folder))


# --- synthetic-lr ------------------------------------------------------------------------------


def test_synthetic_lr_has_the_requested_rows_and_features_and_a_tenth_as_test() -> None:
    data = load_dataset("synthetic-lr", synthetic_samples=20_000, synthetic_features=30)
    assert data.x_train.shape == (20_000, 30) and data.x_test.shape == (2_000, 30)
    assert data.x_train.dtype == np.float32 and data.y_train.dtype == np.int64
    assert data.num_classes == 2 and data.input_shape == (30,)
    assert set(np.unique(data.y_train)) == {0, 1} and 0.2 < data.y_train.mean() < 0.8
    assert abs(float(data.x_train.std()) - 1) < 0.02
    small = load_dataset("synthetic-lr", synthetic_samples=500, synthetic_features=3)
    assert small.x_test.shape == (1000, 3)


def test_synthetic_lr_same_seed_gives_same_data_and_other_seed_differs() -> None:
    a, b, c = (
        load_dataset("synthetic-lr", seed=s, synthetic_samples=2000, synthetic_features=10)
        for s in (7, 7, 8)
    )
    for name in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.x_train, c.x_train) and not np.array_equal(a.y_test, c.y_test)


def test_synthetic_lr_is_learnable_by_logistic_regression_but_noisy() -> None:
    data = load_dataset("synthetic-lr", seed=3, synthetic_samples=20_000)
    x, y = data.x_train, data.y_train.astype(np.float32)
    w, b = np.zeros(x.shape[1], np.float32), 0.0
    for _ in range(100):  # full-batch gradient descent on the mean logistic loss
        err = 1 / (1 + np.exp(-(x @ w + b))) - y
        w -= 2.0 * x.T @ err / len(y)
        b -= 2.0 * err.mean()
    accuracy = (((data.x_test @ w + b) > 0) == data.y_test).mean()
    assert 0.75 < accuracy < 0.95


def test_synthetic_lr_rejects_non_positive_sizes() -> None:
    with raises("synthetic_samples must be >= 1, got 0"):
        load_dataset("synthetic-lr", synthetic_samples=0)
    with raises("synthetic_features must be >= 1, got -2"):
        load_dataset("synthetic-lr", synthetic_features=-2)


# --- .npz files --------------------------------------------------------------------------------


def test_npz_with_train_and_test_arrays_round_trips(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x_train = rng.integers(-50, 50, (40, 2, 3)).astype(np.int16)
    x_test = rng.integers(-50, 50, (8, 2, 3)).astype(np.int16)
    y_train, y_test = np.arange(40) % 3, np.array([0, 1, 2, 3, 4, 0, 1, 2], dtype=np.float32)
    path = tmp_path / "d.npz"
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    data = load_dataset(str(path))
    assert data.name == str(path) and data.input_shape == (2, 3) and data.num_classes == 5
    assert data.x_train.dtype == np.float32 and data.y_test.dtype == np.int64
    np.testing.assert_array_equal(data.x_train, x_train.astype(np.float32))
    np.testing.assert_array_equal(data.x_test, x_test.astype(np.float32))
    np.testing.assert_array_equal(data.y_train, y_train)
    np.testing.assert_array_equal(data.y_test, y_test.astype(np.int64))


def test_npz_with_x_and_y_holds_out_the_last_tenth_as_test(tmp_path: Path) -> None:
    x = np.arange(50 * 4, dtype=np.float64).reshape(50, 4)
    y = np.arange(50) % 2
    np.savez(tmp_path / "d.npz", x=x, y=y)
    data = load_dataset(str(tmp_path / "d.npz"))
    np.testing.assert_array_equal(data.x_train, x[:45])
    np.testing.assert_array_equal(data.x_test, x[45:])
    np.testing.assert_array_equal(data.y_test, y[45:])
    assert data.num_classes == 2 and data.input_shape == (4,)


GOOD_X, GOOD_Y = np.ones((10, 3)), np.arange(10) % 2
NPZ_FORMS = (
    "an .npz holds arrays x_train, y_train, x_test, y_test, or x and y (the last tenth becomes"
    " the test set)"
)
NPZ_ERRORS = {
    "missing array": (
        {"x_train": GOOD_X, "x_test": GOOD_X, "y_test": GOOD_Y, "a": GOOD_Y},
        f"missing array 'y_train' (found: a, x_test, x_train, y_test); {NPZ_FORMS}",
    ),
    "no known arrays": (
        {"a": GOOD_X, "b": GOOD_Y},
        f"missing array 'x' (found: a, b); {NPZ_FORMS}",
    ),
    "capitalized names": (
        {"X_train": GOOD_X, "y_train": GOOD_Y, "X_test": GOOD_X, "y_test": GOOD_Y},
        "missing array 'x_train' (found: X_test, X_train, y_test, y_train);"
        f" {NPZ_FORMS}; array names are case-sensitive",
    ),
    "capitalized x": (
        {"X": GOOD_X, "Y": GOOD_Y},
        f"missing array 'x' (found: X, Y); {NPZ_FORMS}; array names are case-sensitive",
    ),
    "no arrays": ({}, f"missing array 'x' (found: no arrays); {NPZ_FORMS}"),
    "negative label": (
        {"x": GOOD_X, "y": np.array([0, 1, 0, -1, 0, 1, 0, 1, 0, 1])},
        "array 'y' has label -1 in row 3; labels must be integers >= 0",
    ),
    "non-integral label": (
        {"x": GOOD_X, "y": np.array([0, 1, 0.5, 1, 0, 1, 0, 1, 0, 1])},
        "array 'y' has label 0.5 in row 2; labels must be integers >= 0",
    ),
    "row counts differ": (
        {"x": GOOD_X, "y": GOOD_Y[:9]},
        "array 'x' has 10 rows but array 'y' has 9",
    ),
    "empty": (
        {"x_train": np.ones((0, 3)), "y_train": np.ones(0), "x_test": GOOD_X, "y_test": GOOD_Y},
        "array 'x_train' has no rows",
    ),
    "nan": (
        {"x": np.where(np.arange(30).reshape(10, 3) == 13, np.nan, 1.0), "y": GOOD_Y},
        "array 'x' has NaN or Inf in row 4",
    ),
    "overflows float32": (
        {"x": np.where(np.arange(30).reshape(10, 3) == 29, 1e300, 1.0), "y": GOOD_Y},
        "array 'x' has NaN or Inf in row 9",
    ),
    "string features": (
        {"x": np.full((10, 3), "a"), "y": GOOD_Y},
        "array 'x' must be numeric, got dtype <U1",
    ),
    "string labels": (
        {"x": GOOD_X, "y": np.full(10, "b")},
        "array 'y' must hold integer labels, got dtype <U1",
    ),
    "1-D features": (
        {"x": np.ones(10), "y": GOOD_Y},
        "array 'x' must have shape (rows, features...), got (10,)",
    ),
    "one-hot labels": (
        {"x": GOOD_X, "y": np.eye(3)[GOOD_Y]},
        "array 'y' must be 1-D (one label per row), got shape (10, 3)",
    ),
    "train and test widths differ": (
        {"x_train": GOOD_X, "y_train": GOOD_Y, "x_test": np.ones((10, 4)), "y_test": GOOD_Y},
        "training rows have shape (3,) but test rows have shape (4,)",
    ),
    "one row": (
        {"x": GOOD_X[:1], "y": GOOD_Y[:1]},
        "only 1 row; need at least 2 to hold out a test set",
    ),
}


@pytest.mark.parametrize("arrays, message", NPZ_ERRORS.values(), ids=NPZ_ERRORS.keys())
def test_bad_npz_gets_one_error_naming_the_file_and_the_problem(
    tmp_path: Path, arrays: dict, message: str
) -> None:
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with raises(f"data path {path}: {message}"):
        load_dataset(str(path))


UNPICKLED: list[str] = []


def _record_unpickle(tag: str) -> str:
    UNPICKLED.append(tag)
    return tag


class _Tripwire:
    def __reduce__(self) -> tuple:
        return (_record_unpickle, ("unpickled",))


def test_npz_holding_pickled_objects_is_refused_without_unpickling(tmp_path: Path) -> None:
    path = tmp_path / "evil.npz"
    x = np.empty((10, 1), dtype=object)
    x[:] = _Tripwire()
    np.savez(path, x=x, y=GOOD_Y)
    with raises(
        f"data path {path}: cannot read array 'x' (Object arrays cannot be loaded when"
        " allow_pickle=False)"
    ):
        load_dataset(str(path))
    assert UNPICKLED == []


def test_npz_that_is_not_a_zip_archive_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "garbage.npz"
    path.write_bytes(b"not a zip file at all" * 10)
    with raises(f"data path {path}: not an .npz (zip) archive"):
        load_dataset(str(path))


def test_npz_with_a_corrupted_member_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "flipped.npz"
    np.savez(path, x=np.arange(4000.0).reshape(1000, 4), y=np.zeros(1000, dtype=np.int64))
    data = bytearray(path.read_bytes())
    data[data.find(b"\x93NUMPY") + 500] ^= 0xFF
    path.write_bytes(bytes(data))
    with raises(f"data path {path}: cannot read array 'x' (Bad CRC-32 for file 'x.npy')"):
        load_dataset(str(path))


# --- .parquet files ----------------------------------------------------------------------------


def features_table(x: np.ndarray, y: np.ndarray, fixed: bool = False) -> pa.Table:
    flat = pa.array(x.reshape(-1))
    width = x.shape[1]
    offsets = pa.array(np.arange(0, len(x) * width + 1, width, dtype=np.int32))
    column = (
        pa.FixedSizeListArray.from_arrays(flat, width)
        if fixed
        else pa.ListArray.from_arrays(offsets, flat)
    )
    return pa.table({"features": column, "label": pa.array(y)})


def test_parquet_list_of_doubles_round_trips_with_the_last_tenth_held_out(tmp_path: Path) -> None:
    x = np.random.default_rng(1).standard_normal((30, 5))
    y = (np.arange(30) % 4).astype(np.int32)
    pq.write_table(features_table(x, y), tmp_path / "d.parquet", row_group_size=7)
    data = load_dataset(str(tmp_path / "d.parquet"))
    np.testing.assert_array_equal(data.x_train, x[:27].astype(np.float32))
    np.testing.assert_array_equal(data.x_test, x[27:].astype(np.float32))
    np.testing.assert_array_equal(data.y_train, y[:27])
    assert data.num_classes == 4 and data.input_shape == (5,)
    assert data.x_train.flags.c_contiguous and data.x_train.flags.writeable


def test_parquet_fixed_size_float_lists_with_integral_float_labels(tmp_path: Path) -> None:
    x = np.arange(20 * 3, dtype=np.float32).reshape(20, 3)
    y = np.array([0.0, 1.0, 2.0, 6.0] * 5)
    pq.write_table(features_table(x, y, fixed=True), tmp_path / "d.parquet")
    data = load_dataset(str(tmp_path / "d.parquet"))
    np.testing.assert_array_equal(data.x_train, x[:18])
    np.testing.assert_array_equal(data.y_test, [2, 6])
    assert data.y_test.dtype == np.int64 and data.num_classes == 7


def test_parquet_folder_of_part_files_reads_every_part_in_order(tmp_path: Path) -> None:
    x = np.arange(40 * 2, dtype=np.float64).reshape(40, 2)
    y = np.arange(40) % 2
    folder = tmp_path / "parts"
    folder.mkdir()
    pq.write_table(features_table(x[:25], y[:25]), folder / "part-00000.parquet")
    pq.write_table(features_table(x[25:], y[25:]), folder / "part-00001.parquet")
    (folder / "_SUCCESS").write_bytes(b"")  # what Spark leaves next to its parts
    data = load_dataset(str(folder))
    np.testing.assert_array_equal(np.concatenate([data.x_train, data.x_test]), x)
    assert len(data.x_test) == 4


def test_parquet_folder_with_train_and_test_files_uses_them_as_the_split(tmp_path: Path) -> None:
    x = np.arange(30, dtype=np.float64).reshape(15, 2)
    y = np.arange(15) % 3
    pq.write_table(features_table(x[:10], y[:10]), tmp_path / "train.parquet")
    pq.write_table(features_table(x[10:], y[10:]), tmp_path / "test.parquet")
    data = load_dataset(str(tmp_path))
    np.testing.assert_array_equal(data.x_train, x[:10])
    np.testing.assert_array_equal(data.x_test, x[10:])
    np.testing.assert_array_equal(data.y_test, y[10:])


# a pyspark.ml.linalg vector column as Spark's df.write.parquet stores it: a dense one, a sparse one
SPARK_VECTORS = pa.array(
    [
        {"type": 1, "size": None, "indices": None, "values": [1.0, 2.0]},
        {"type": 0, "size": 2, "indices": [1], "values": [3.0]},
    ],
    pa.struct(
        [
            pa.field("type", pa.int8(), nullable=False),
            ("size", pa.int32()),
            ("indices", pa.list_(pa.int32())),
            ("values", pa.list_(pa.float64())),
        ]
    ),
)
PARQUET_ERRORS = {
    "missing label column": (
        pa.table({"features": [[1.0, 2.0]] * 3, "y": [0, 1, 0]}),
        "missing column 'label' (found: features, y)",
    ),
    "ragged lists": (
        pa.table({"features": [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, 2.0]], "label": [0, 1, 0]}),
        "column 'features' is ragged: row 0 has 3 values, row 2 has 2",
    ),
    "lists of strings": (
        pa.table({"features": [["a"], ["b"]], "label": [0, 1]}),
        "column 'features' must hold numbers, got list<element: string>",
    ),
    "scalar features": (
        pa.table({"features": [1.0, 2.0], "label": [0, 1]}),
        "column 'features' must be a list of numbers, got double",
    ),
    "spark ml vectors": (
        pa.table({"features": SPARK_VECTORS, "label": [0, 1]}),
        "column 'features' must be a list of numbers, got struct<type: int8 not null, size:"
        " int32, indices: list<element: int32>, values: list<element: double>>; it holds Spark"
        " ML vectors (a VectorAssembler's output): write it as an array,"
        " df.withColumn('features', pyspark.ml.functions.vector_to_array('features')), or pass"
        " the DataFrame to ember.spark.fit, which takes vectors",
    ),
    "string labels": (
        pa.table({"features": [[1.0], [2.0]], "label": ["a", "b"]}),
        "column 'label' must hold integer labels, got string",
    ),
    "non-integral label": (
        pa.table({"features": [[1.0], [2.0], [3.0]], "label": [0.0, 1.5, 1.0]}),
        "column 'label' has label 1.5 in row 1; labels must be integers >= 0",
    ),
    "negative label": (
        pa.table({"features": [[1.0], [2.0], [3.0]], "label": [0, -2, 1]}),
        "column 'label' has label -2 in row 1; labels must be integers >= 0",
    ),
    "null row": (
        pa.table({"features": [[1.0], None, [3.0]], "label": [0, 1, 1]}),
        "column 'features' has 1 null rows",
    ),
    "nan feature": (
        pa.table({"features": [[1.0], [float("nan")], [3.0]], "label": [0, 1, 1]}),
        "column 'features' has NaN or Inf in row 1",
    ),
    "no rows": (
        pa.table(
            {"features": pa.array([], pa.list_(pa.float32())), "label": pa.array([], pa.int64())}
        ),
        "column 'features' has no rows",
    ),
}


@pytest.mark.parametrize("table, message", PARQUET_ERRORS.values(), ids=PARQUET_ERRORS.keys())
def test_bad_parquet_gets_one_error_naming_the_file_and_the_column(
    tmp_path: Path, table: pa.Table, message: str
) -> None:
    path = tmp_path / "bad.parquet"
    pq.write_table(table, path)
    with raises(f"data path {path}: {message}"):
        load_dataset(str(path))


def test_corrupt_parquet_file_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.parquet"
    path.write_bytes(b"PAR1" + b"\x00" * 64)
    with pytest.raises(
        ConfigError, match=f"^data path {re.escape(str(path))}: cannot read as Parquet"
    ):
        load_dataset(str(path))


# --- what a spec may be ------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["foo", "MNIST", ""])
def test_unknown_name_lists_the_names_and_the_file_kinds(spec: str) -> None:
    with raises(UNKNOWN + repr(spec)):
        load_dataset(spec)


def test_missing_file_is_reported_as_missing_not_as_unknown_name(tmp_path: Path) -> None:
    with raises(f"data path {tmp_path / 'x.npz'}: no such file or directory"):
        load_dataset(str(tmp_path / "x.npz"))


def test_unsupported_file_type_and_empty_folder_are_refused(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("1,2\n")
    with raises(
        f"data path {tmp_path / 'd.csv'}: unsupported file type '.csv'; expected .npz or .parquet"
    ):
        load_dataset(str(tmp_path / "d.csv"))
    (tmp_path / "empty").mkdir()
    with raises(
        f"data path {tmp_path / 'empty'}: folder holds neither MNIST IDX files nor .parquet files"
    ):
        load_dataset(str(tmp_path / "empty"))


def test_dataset_refuses_arrays_that_break_its_contract() -> None:
    x, y = np.zeros((4, 2), np.float32), np.array([0, 1, 2, 1])
    with raises("dataset d: y_train has labels outside [0, 2)"):
        Dataset("d", x, y, x, y % 2, 2, (2,))
    with raises(
        "dataset d: x_test must be C-contiguous float32 or int64 (or a structured array), got"
        " C-contiguous float64"
    ):
        Dataset("d", x, y, x.astype(np.float64), y, 3, (2,))
    with raises("dataset d: x_train has rows of shape (2,), but input_shape is (3,)"):
        Dataset("d", x, y, x, y, 3, (3,))
    with raises("dataset d: y_test must be int64 or float32 with 4 rows, got float64 (4,)"):
        Dataset("d", x, y, x, y.astype(np.float64), 3, (2,))
    tokens = np.array([[0, 2], [IGNORED_CLASS, 1], [1, 1], [2, 0]])  # -100: a padded token
    Dataset("d", x, tokens, x, tokens, 3, (2,))  # per-token classes fit
    with raises("dataset d: y_train has labels outside [0, 2)"):
        Dataset("d", x, tokens, x, tokens, 2, (2,))


# --- shards ------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 100_000), world=st.integers(1, 64))
def test_shards_are_contiguous_disjoint_equal_and_cover_all_but_the_remainder(
    n: int, world: int
) -> None:
    if n < world:
        with pytest.raises(ConfigError):
            shard_indices(n, 0, world)
        return
    shards = [shard_indices(n, rank, world) for rank in range(world)]
    assert all(s.dtype == np.int64 and len(s) == n // world for s in shards)
    assert all((np.diff(s) == 1).all() for s in shards)
    np.testing.assert_array_equal(np.concatenate(shards), np.arange(n - n % world))


def test_ten_rows_over_three_workers_drop_the_last_row() -> None:
    assert [shard_indices(10, r, 3).tolist() for r in range(3)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_shard_indices_refuses_bad_rank_world_or_too_few_rows() -> None:
    with raises("world must be >= 1, got 0"):
        shard_indices(10, 0, 0)
    with raises("rank must be in [0, 4), got 4"):
        shard_indices(10, 4, 4)
    with raises("cannot split 3 rows over 4 workers: each needs at least one row"):
        shard_indices(3, 0, 4)
