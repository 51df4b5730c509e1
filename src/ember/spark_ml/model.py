"""EmberModel: a trained ember model as a Spark ML Transformer, scoring on the executors, and
its ML persistence (Spark's params metadata beside the run's model.json and model.safetensors)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from pyspark.ml import Model
from pyspark.ml.util import (
    DefaultParamsReader,
    DefaultParamsWriter,
    MLReadable,
    MLReader,
    MLWritable,
    MLWriter,
)

from ember.config.objective import targets_of
from ember.data.spark import features_array
from ember.errors import CheckpointError, ConfigError
from ember.export import JSON_LIMIT, MODEL_FILE, MODEL_JSON, ModelSource, load_bytes
from ember.spark_ml.params import EmberParams
from ember.spark_ml.scoring import CLASSES, VALUE, VALUES, scorer

MODEL_DIR = "model"  # beside Spark's metadata/: the run's two model files, as a run wrote them


class EmberModel(Model, EmberParams, MLReadable["EmberModel"], MLWritable):
    """The model an EmberEstimator trained, with its uid and params. `transform(df)` adds
    `rawPredictionCol` (the model's output, its logits, an ML vector), `probabilityCol` (their
    softmax, an ML vector) and `predictionCol` (the class index, double), as Spark's
    classifiers do,
    or for a loss whose targets are values (mse, l1, huber, bce_with_logits) the model's raw
    output as `predictionCol` alone (a double for a one-wide output, else an array), scored
    on the executors a whole Arrow batch at a time; rows never reach the driver.

    `summary` and `run_dir` are the run's (None for a loaded model: `hasSummary` says which);
    `numClasses` and `numFeatures` are the model's, as Spark's; `torch_model()` gives the
    nn.Module."""

    def __init__(
        self,
        described: bytes = b"",
        weights: bytes = b"",
        summary: dict[str, Any] | None = None,
        run_dir: Path | None = None,
    ) -> None:
        super().__init__()
        self._described, self._weights = described, weights  # model.json, model.safetensors
        self.summary, self.run_dir = summary, run_dir

    @classmethod
    def from_files(
        cls, folder: Path, factory: ModelSource, summary: dict[str, Any] | None = None
    ) -> EmberModel:
        """The model of `folder`'s model.json and model.safetensors (a run directory), checked
        by building it here once, so that a damaged file fails now rather than in a task."""
        missing = [name for name in (MODEL_JSON, MODEL_FILE) if not (folder / name).is_file()]
        if missing:
            raise CheckpointError(f"{folder}: no {' or '.join(missing)}")
        with open(folder / MODEL_JSON, "rb") as f:
            described = f.read(JSON_LIMIT + 1)
        weights = (folder / MODEL_FILE).read_bytes()
        load_bytes(described, weights, factory, folder)
        return cls(described, weights, summary, folder)

    def torch_model(self) -> torch.nn.Module:
        """The trained nn.Module, parameters and buffers, in eval mode."""
        self._require_weights()
        return load_bytes(self._described, self._weights, self.model_source(), MODEL_DIR)[0]

    @property
    def numClasses(self) -> int:
        """The model's outputs: its classes (values per row for a regression's)."""
        self._require_weights()
        return int(json.loads(self._described)["num_classes"])

    @property
    def numFeatures(self) -> int:
        """The values of one row's features, as featuresCol holds them."""
        self._require_weights()
        return math.prod(json.loads(self._described)["input_shape"])

    @property
    def hasSummary(self) -> bool:
        """Whether the run's summary is here: after a fit, not after a load."""
        return self.summary is not None

    def _require_weights(self) -> None:
        if not self._weights:
            raise ConfigError(
                "this EmberModel holds no trained model: get one from EmberEstimator.fit or"
                " EmberModel.load"
            )

    def _transform(self, dataset: Any) -> Any:
        from pyspark.ml.functions import array_to_vector
        from pyspark.sql import functions as F
        from pyspark.sql.functions import pandas_udf

        self._require_weights()
        features = features_array(dataset, self.getFeaturesCol())
        where = str(self.run_dir or MODEL_DIR)
        result = self._result()
        body = scorer(self._described, self._weights, self.model_source(), where, result)
        # pyspark's stubs have no overload for an iterator UDF that returns a struct
        score = pandas_udf(body, result)  # type: ignore[call-overload]
        scored = f"__ember_scores_{self.uid}"
        frame = dataset.withColumn(scored, score(features))
        vectors = (self.getRawPredictionCol(), "logits"), (self.getProbabilityCol(), "probability")
        for column, field in vectors if result == CLASSES else ():  # in Spark's classifiers' order
            if column:  # an empty column name: not wanted, as Spark's classifiers take it
                frame = frame.withColumn(column, array_to_vector(F.col(f"{scored}.{field}")))
        if self.getPredictionCol():
            frame = frame.withColumn(self.getPredictionCol(), F.col(f"{scored}.prediction"))
        return frame.drop(scored)

    def _result(self) -> str:
        """What transform adds: classes for a classifier's loss (and a user's loss), else the
        raw output, one double for a one-wide output (model.json's num_classes)."""
        if targets_of(str(self.getOrDefault(self.loss))) in ("classes", None):
            return CLASSES
        return VALUE if json.loads(self._described).get("num_classes") == 1 else VALUES

    def write(self) -> MLWriter:
        self.check_persistable()
        return _Writer(self)

    @classmethod
    def read(cls) -> MLReader[EmberModel]:
        return _Reader()


def local_folder(path: str) -> Path:
    """A save path as a folder of this machine: the model's files are written by the driver."""
    scheme, sep, rest = path.partition("://")
    if sep and scheme != "file":
        raise ConfigError(
            f"EmberModel saves to and loads from the driver's file system; got {path!r}"
        )
    return Path(rest if sep else path.removeprefix("file:")).expanduser()


class _Writer(MLWriter):
    def __init__(self, instance: EmberModel) -> None:
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        self.instance._require_weights()
        folder = local_folder(path) / MODEL_DIR
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sparkSession)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / MODEL_JSON).write_bytes(self.instance._described)
        (folder / MODEL_FILE).write_bytes(self.instance._weights)


class _Reader(MLReader[EmberModel]):
    def load(self, path: str) -> EmberModel:
        expected = f"{EmberModel.__module__}.{EmberModel.__name__}"
        try:
            metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        except Exception as exc:  # Spark's own errors say little more than "not found"
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CheckpointError(
                f"{path}: not a saved EmberModel: its metadata cannot be read ({first})"
            ) from None
        if metadata.get("class") != expected:
            raise CheckpointError(
                f"{path}: not a saved EmberModel: its metadata names {metadata.get('class')!r}"
            )
        instance = EmberModel()
        instance._resetUid(metadata["uid"])
        try:
            DefaultParamsReader.getAndSetParams(instance, metadata)
        except (AttributeError, TypeError, ValueError, AssertionError) as exc:
            raise CheckpointError(f"{path}: the saved EmberModel's params: {exc}") from None
        loaded = EmberModel.from_files(local_folder(path) / MODEL_DIR, instance.model_source())
        instance._described, instance._weights = loaded._described, loaded._weights
        return instance
