"""A model trained on ember's image data records what raw pixels must go through, and
EmberModel's scorer applies it to raw rows, leaving normalized ones as they are."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from ember.config import RunConfig
from ember.data.pixels import input_transform, to_model_inputs
from ember.errors import ConfigError
from ember.export import save_model
from ember.models import build_model
from ember.spark_ml.scoring import scorer


def test_image_data_records_the_normalization_and_other_data_none() -> None:
    expected = {"kind": "pixels", "scale": 1 / 255, "mean": 0.1307, "std": 0.3081}
    assert input_transform("mnist") == input_transform("digits") == expected
    assert input_transform("synthetic-lr") is None and input_transform("rows.npz") is None


def test_raw_rows_are_normalized_and_normalized_ones_left_alone() -> None:
    transform = input_transform("digits")
    pixels = np.random.default_rng(0).random((4, 784), dtype=np.float32)
    normalized = (pixels - np.float32(0.1307)) / np.float32(0.3081)
    got, said = to_model_inputs(pixels, transform)
    np.testing.assert_allclose(got, normalized, rtol=1e-6)
    assert said == "[0, 1] pixels, normalized as in training"
    got, said = to_model_inputs((pixels * 255).astype(np.uint8), transform)
    assert said == "0..255 pixels, normalized as in training"
    np.testing.assert_allclose(got, normalized, atol=0.02)  # whole pixel values
    assert to_model_inputs(normalized, transform) == (normalized, None)
    with pytest.raises(ConfigError, match="scale, mean and std must be numbers"):
        to_model_inputs(pixels, {"kind": "pixels", "scale": "x", "mean": 0, "std": 1})


def test_ember_models_scorer_normalizes_raw_pixel_rows(tmp_path: Path) -> None:
    model = build_model("logreg", (1, 28, 28), 10, seed=0, probe=None)
    save_model(tmp_path, model, RunConfig(data="digits", model="logreg"), ((1, 28, 28), 10))
    described = (tmp_path / "model.json").read_bytes()
    weights = (tmp_path / "model.safetensors").read_bytes()
    pixels = np.random.default_rng(1).random((8, 784), dtype=np.float32)
    score = scorer(described, weights, "logreg", str(tmp_path))
    scored = next(score(iter([pd.Series(list(pixels))])))
    with torch.no_grad():
        inputs = torch.from_numpy((pixels - np.float32(0.1307)) / np.float32(0.3081))
        expected = torch.softmax(model(inputs.reshape(8, 1, 28, 28)).double(), dim=1).numpy()
    np.testing.assert_allclose(np.stack(scored["probability"]), expected, rtol=1e-5)
