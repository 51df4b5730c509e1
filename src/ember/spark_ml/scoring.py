"""The executors' side of EmberModel.transform: the model rebuilt once per Python worker, then
each Arrow batch of features scored with torch."""

# No `from __future__ import annotations`: pandas_udf reads the scorer's type hints as objects.
import hashlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd
import torch

from ember.data.pixels import to_model_inputs
from ember.errors import ConfigError
from ember.export import ModelSource, Shape, load_bytes

# What a scorer yields per row: a classifier's class index, probabilities and logits, or a
# regression's raw output (one value, or an array of the output's values).
CLASSES = "prediction double, probability array<double>, logits array<double>"
VALUE, VALUES = "prediction double", "prediction array<double>"
_cache: dict[str, tuple[torch.nn.Module, Shape]] = {}  # one model per Python worker process


def scorer(
    described: bytes, weights: bytes, factory: ModelSource, where: str, result: str = CLASSES
) -> Callable[[Iterator[pd.Series]], Iterator[pd.DataFrame]]:
    """A pandas_udf body: batches of feature arrays in, `result` out (CLASSES: the class
    index, probabilities and logits; VALUE or VALUES: the raw output). The model's files travel in
    its closure, which Spark ships once per task (and broadcasts when large); a Python
    worker that Spark reuses keeps the model it built."""

    transform = json.loads(described).get("input_transform")  # raw pixels: as in training

    def score(batches: Iterator[pd.Series]) -> Iterator[pd.DataFrame]:
        # torch's threads: Spark sets OMP_NUM_THREADS to the task's cores (spark.task.cpus)
        module, (shape, _) = _model(described, weights, factory, where)
        for features in batches:
            outputs = _outputs(module, features, shape, transform)
            yield _classes(outputs) if result == CLASSES else _values(outputs, result)

    return score


def _model(described: bytes, weights: bytes, factory: ModelSource, where: str) -> tuple[Any, Shape]:
    # a module instance is this task's own copy (it came in the closure): weights load into it
    spec = factory if isinstance(factory, str) else type(factory).__qualname__
    key = hashlib.sha256(described + weights).hexdigest() + spec
    if key not in _cache:
        _cache.clear()
        _cache[key] = load_bytes(described, weights, factory, where)
    return _cache[key]


@torch.no_grad()
def _outputs(
    module: torch.nn.Module, features: pd.Series, shape: tuple[int, ...], transform: object = None
) -> torch.Tensor:
    if features.isna().any():
        raise ConfigError(f"the features column has {int(features.isna().sum())} null rows")
    width = int(np.prod(shape))
    x = np.stack(features.to_numpy()) if len(features) else np.empty((0, width), np.float32)
    if x.ndim != 2 or x.shape[1] != width:
        raise ConfigError(
            f"the features column holds rows of {x.shape[1:]} values; the model takes {width}"
            f" (input shape {list(shape)})"
        )
    x = to_model_inputs(x, transform)[0]
    inputs = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    outputs: torch.Tensor = module(inputs.reshape(len(x), *shape))
    return outputs.double()


def _classes(logits: torch.Tensor) -> pd.DataFrame:
    if logits.ndim != 2:
        raise ConfigError(
            f"the model's output has shape {list(logits.shape)}; transform scores a"
            " classifier's (rows, classes) output"
        )
    probabilities = torch.softmax(logits, dim=1).numpy()
    return pd.DataFrame(
        {
            "prediction": probabilities.argmax(axis=1).astype(np.float64),
            "probability": list(probabilities),
            # centred per row: softmax and argmax are as they were, and a two-class model's
            # second value is half its margin, which BinaryClassificationEvaluator ranks by
            # (as LogisticRegression's [-m, m])
            "logits": list((logits - logits.mean(dim=1, keepdim=True)).numpy()),
        }
    )


def _values(outputs: torch.Tensor, result: str) -> pd.DataFrame:
    flat = outputs.reshape(len(outputs), -1).numpy()
    if result == VALUE:  # a one-wide output, as a column of doubles
        return pd.DataFrame({"prediction": flat[:, 0]})
    return pd.DataFrame({"prediction": list(flat)})
