"""What a model trained on MNIST-style images expects done to raw pixels, recorded in its
model.json (`input_transform`) and applied where raw pixels meet it again (`ember predict`,
EmberModel.transform): ember's named image datasets are scaled to [0, 1] and normalized with
MNIST's mean and std, so a model fed [0, 1] pixels as they are scores near chance."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ember.data.idx import MNIST_MEAN, MNIST_STD, find_idx_files
from ember.errors import ConfigError

PIXELS = "pixels"  # the kind of transform: (x * scale - mean) / std, on raw pixels only
IMAGE_DATASETS = ("mnist", "digits")


def input_transform(data: str) -> dict[str, Any] | None:
    """The transform a model trained on `data` (a RunConfig's data) expects of raw pixels:
    ember's image datasets and IDX folders are (x / 255 - 0.1307) / 0.3081; anything else is
    taken as it comes (None)."""
    path = Path(data)
    if data not in IMAGE_DATASETS and not (path.is_dir() and find_idx_files(path)):
        return None
    return {"kind": PIXELS, "scale": 1 / 255, "mean": MNIST_MEAN, "std": MNIST_STD}


def to_model_inputs(x: np.ndarray, transform: object) -> tuple[np.ndarray, str | None]:
    """`x` as the model expects it, and what was done (None: nothing). Rows with a negative
    value are normalized already (MNIST's background is -0.42 there) and go as they are;
    raw rows are 0..255 pixels (any dtype, some above 1) or [0, 1] pixels."""
    if transform is None:
        return x, None
    scale, mean, std = _checked(transform)
    values = np.asarray(x, dtype=np.float32)
    if values.size == 0 or float(values.min()) < 0:
        return x, None
    high = float(values.max()) > 1.0
    scaled = values * np.float32(scale) if high else values
    said = f"{'0..255' if high else '[0, 1]'} pixels, normalized as in training"
    return (scaled - np.float32(mean)) / np.float32(std), said


def _checked(transform: object) -> tuple[float, float, float]:
    """model.json is a user's file: a transform of another shape is one clear error."""
    if not isinstance(transform, dict) or transform.get("kind") != PIXELS:
        raise ConfigError(f"model.json: input_transform must be a {PIXELS!r} transform")
    values = [transform.get(k) for k in ("scale", "mean", "std")]
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
        raise ConfigError("model.json: input_transform's scale, mean and std must be numbers")
    scale, mean, std = (float(v) for v in values)  # type: ignore[arg-type]
    if std <= 0 or scale <= 0:
        raise ConfigError("model.json: input_transform's scale and std must be above 0")
    return scale, mean, std
