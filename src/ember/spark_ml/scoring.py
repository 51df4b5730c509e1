"""The executors' side of EmberModel.transform: the model rebuilt once per Python worker, then
each Arrow batch of features scored with torch."""

# No `from __future__ import annotations`: pandas_udf reads the scorer's type hints as objects.
import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd
import torch

from ember.errors import ConfigError
from ember.export import Shape, load_bytes

RESULT = "prediction double, probability array<double>"  # what a scorer yields per row
_cache: dict[str, tuple[torch.nn.Module, Shape]] = {}  # one model per Python worker process


def scorer(
    described: bytes, weights: bytes, factory: str, where: str
) -> Callable[[Iterator[pd.Series]], Iterator[pd.DataFrame]]:
    """A pandas_udf body: batches of feature arrays in, class index and probabilities out.
    The model's files travel in its closure, which Spark ships once per task (and
    broadcasts when large); a Python worker that Spark reuses keeps the model it built."""

    def score(batches: Iterator[pd.Series]) -> Iterator[pd.DataFrame]:
        # torch's threads: Spark sets OMP_NUM_THREADS to the task's cores (spark.task.cpus)
        module, (shape, _) = _model(described, weights, factory, where)
        for features in batches:
            yield _scores(module, features, shape)

    return score


def _model(described: bytes, weights: bytes, factory: str, where: str) -> tuple[Any, Shape]:
    key = hashlib.sha256(described + weights).hexdigest() + factory
    if key not in _cache:
        _cache.clear()
        _cache[key] = load_bytes(described, weights, factory, where)
    return _cache[key]


@torch.no_grad()
def _scores(module: torch.nn.Module, features: pd.Series, shape: tuple[int, ...]) -> pd.DataFrame:
    if features.isna().any():
        raise ConfigError(f"the features column has {int(features.isna().sum())} null rows")
    width = int(np.prod(shape))
    x = np.stack(features.to_numpy()) if len(features) else np.empty((0, width), np.float32)
    if x.ndim != 2 or x.shape[1] != width:
        raise ConfigError(
            f"the features column holds rows of {x.shape[1:]} values; the model takes {width}"
            f" (input shape {list(shape)})"
        )
    inputs = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    logits = module(inputs.reshape(len(x), *shape))
    if logits.ndim != 2:
        raise ConfigError(
            f"the model's output has shape {list(logits.shape)}; transform scores a"
            " classifier's (rows, classes) output"
        )
    probabilities = torch.softmax(logits.double(), dim=1).numpy()
    return pd.DataFrame(
        {
            "prediction": probabilities.argmax(axis=1).astype(np.float64),
            "probability": list(probabilities),
        }
    )
