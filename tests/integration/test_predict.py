"""`ember predict` writes a run's predictions for a file, batch by batch, and `ember.load`
refuses what it must not run or cannot read, each with one clear error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import ember
from ember.data import load_dataset
from ember.errors import CheckpointError, ConfigError

pytestmark = pytest.mark.timeout(180)
BN = "tests.bn_models:bn_mlp"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> ember.RunResult:
    out = tmp_path_factory.mktemp("predict") / "run"
    return ember.fit(model=BN, data="digits", strategy="single", workers=1, epochs=1, out=str(out))


def _expected(result: ember.RunResult, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with torch.no_grad():
        probabilities = torch.softmax(result.model(torch.from_numpy(x)), dim=1).numpy()
    return probabilities.argmax(axis=1), probabilities


def test_predict_streams_an_npz_into_parquet_with_classes_and_probabilities(
    run: ember.RunResult, tmp_path: Path
) -> None:
    x = load_dataset("digits").x_test[:1000]
    np.savez(tmp_path / "new.npz", x=x)
    done = ember.predict(run.run_dir, tmp_path / "new.npz", tmp_path / "p.parquet", BN, 300)
    assert done["rows"] == 1000 and done["classes"] == 10
    table = pq.read_table(tmp_path / "p.parquet")
    labels, probabilities = _expected(run, x)
    np.testing.assert_array_equal(table.column("prediction").to_numpy(), labels)
    got = np.stack(table.column("probability").to_numpy(zero_copy_only=False))
    # batches of 300 against one of 1,000: with two torch threads the last, shorter batch
    # takes another kernel, a few float32 ulps apart (the suite's earlier tests leave one)
    np.testing.assert_allclose(got, probabilities, rtol=5e-5)


def test_ember_predict_on_the_command_line_reads_parquet_and_writes_csv(
    run: ember.RunResult, tmp_path: Path
) -> None:
    x = load_dataset("digits").x_test[:50]
    features = pa.array(list(x.reshape(50, -1)), type=pa.list_(pa.float32()))
    pq.write_table(pa.table({"features": features}), tmp_path / "rows.parquet", row_group_size=16)
    out = tmp_path / "p.csv"
    done = subprocess.run(
        [sys.executable, "-m", "ember", "predict", "--run", str(run.run_dir), "--data",
         str(tmp_path / "rows.parquet"), "--out", str(out), "--model", BN, "--batch-size", "7"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"] == 50
    written = np.loadtxt(out, delimiter=",", skiprows=1)
    labels, probabilities = _expected(run, x)
    np.testing.assert_array_equal(written[:, 0], labels)
    np.testing.assert_allclose(written[:, 1:], probabilities, rtol=1e-5, atol=1e-7)


def test_predict_never_overwrites_a_file_and_names_a_mismatched_width(
    run: ember.RunResult, tmp_path: Path
) -> None:
    (tmp_path / "kept.csv").write_text("precious\n")
    np.save(tmp_path / "x.npy", np.zeros((4, 5), np.float32))
    with pytest.raises(ConfigError, match="already exists; choose another path"):
        ember.predict(run.run_dir, tmp_path / "x.npy", tmp_path / "kept.csv", BN)
    assert (tmp_path / "kept.csv").read_text() == "precious\n"
    with pytest.raises(ConfigError, match="rows have 5 values from row 0 on; the model takes 784"):
        ember.predict(run.run_dir, tmp_path / "x.npy", tmp_path / "new.csv", BN)
    assert not (tmp_path / "new.csv").exists()  # written whole or not at all
    assert not list(tmp_path.glob(".new.csv.tmp-*"))


def test_load_imports_a_factory_only_when_the_caller_names_it(run: ember.RunResult) -> None:
    with pytest.raises(ConfigError, match=f"pass model='{BN}'"):
        ember.load(run.run_dir)
    assert isinstance(ember.load(run.run_dir, model=BN), torch.nn.Module)


def test_load_from_a_checkpoint_gives_the_module_with_its_buffers(run: ember.RunResult) -> None:
    from_checkpoint = ember.load(run.run_dir / "checkpoints", model=BN)
    exported = ember.load(run.run_dir, model=BN)
    for key, value in exported.state_dict().items():
        torch.testing.assert_close(from_checkpoint.state_dict()[key], value, rtol=0, atol=0)


def test_load_of_a_folder_that_holds_no_model_or_a_damaged_one_is_one_error(
    run: ember.RunResult, tmp_path: Path
) -> None:
    with pytest.raises(CheckpointError, match=r"neither a run directory with model\.safetensors"):
        ember.load(tmp_path)
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "model.json").write_text((run.run_dir / "model.json").read_text())
    (damaged / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: cannot read"):
        ember.load(damaged, model=BN)
    (damaged / "model.json").write_text('{"format": "ember-model/1", "model": 3}')
    with pytest.raises(CheckpointError, match="not an ember model description"):
        ember.load(damaged, model=BN)


@pytest.mark.parametrize("raw", ["unit", "bytes"])
def test_raw_pixels_get_the_normalization_the_model_was_trained_with(
    run: ember.RunResult, tmp_path: Path, raw: str
) -> None:
    """A model trained on digits expects (x / 255 - 0.1307) / 0.3081, which model.json now
    records: pixels in [0, 1] or 0..255 fed to ember predict are normalized first and score
    as the normalized rows do (as they came, [0, 1] pixels scored 0.31 on MNIST)."""
    described = json.loads((run.run_dir / "model.json").read_text())
    assert described["input_transform"] == {
        "kind": "pixels", "scale": 1 / 255, "mean": 0.1307, "std": 0.3081
    }  # fmt: skip
    data = load_dataset("digits")
    x, y = data.x_test[:1000], data.y_test[:1000]
    pixels = x * np.float32(0.3081) + np.float32(0.1307)  # [0, 1], as a user's images come
    given = pixels if raw == "unit" else np.rint(pixels * 255).astype(np.uint8)
    np.savez(tmp_path / "raw.npz", x=given)
    np.savez(tmp_path / "normalized.npz", x=x)
    done = ember.predict(run.run_dir, tmp_path / "raw.npz", tmp_path / "raw.parquet", BN)
    assert done["input_transform"] == [
        ("[0, 1]" if raw == "unit" else "0..255") + " pixels, normalized as in training"
    ]
    as_given = ember.predict(run.run_dir, tmp_path / "normalized.npz", tmp_path / "n.parquet", BN)
    assert as_given["input_transform"] is None
    predicted = pq.read_table(tmp_path / "raw.parquet")["prediction"].to_numpy()
    expected, _ = _expected(run, x)
    assert (predicted == expected).mean() >= 0.99  # 0..255: rounded to whole pixel values
    assert (predicted == y).mean() >= 0.85
