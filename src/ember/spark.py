"""`ember.spark.fit`: train on a Spark DataFrame with the fields of `ember.fit`; and
`EmberEstimator`, `EmberModel` (spark_ml/), the same in Spark ML pipelines.

imports: api, config, engines, errors, models
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ember.api import in_python_terms, label_functions, run_config
from ember.config.objects import model_label
from ember.errors import ConfigError


@in_python_terms
def fit(
    model: str | Callable[..., Any] = "mlp",
    df: Any = None,
    features_col: str = "features",
    label_col: str = "label",
    test_df: Any = None,
    weight_col: str | None = None,
    config_file: str | None = None,
    show_progress: bool | None = None,
    mlflow: bool | None = None,
    **fields: Any,
) -> Any:
    """Train `model` on DataFrame `df` (features: array<float>, array<double> or a Spark ML
    vector; label: numeric) with one Spark barrier task per worker, in df's SparkSession.

    `model` is a name, "package.module:factory", a factory function, or an nn.Module (copied
    to each task with its own initial parameters). The test set is `test_df`, or a seeded
    tenth of `df` held out; either is collected to the driver for the final evaluation, the
    training rows never are. Other fields are those of `ember.fit` (strategy, workers,
    epochs, ...). Without `df`, trains on `data=` like `ember.fit(engine="spark")`. Returns
    a RunResult (.summary, .model, .run_dir). `weight_col` names a column of per-row weights
    (numbers >= 0): each batch's loss is then the mean of weight x row loss under every
    strategy, so that a row counts by its weight wherever it falls (docs/training.md).
    `mlflow` logs the job to one MLflow run (None: when an MLflow run is active), and
    progress shows on a terminal (`show_progress` None), as ember.fit's do.

    It may be called from a script's top-level code (a spark-submit script): the parameter
    servers are fresh interpreters that never import the script, and Spark runs the workers.
    """
    fields = {k.replace("-", "_"): v for k, v in fields.items()}
    if fields.setdefault("engine", "spark") != "spark":
        raise ConfigError(f"ember.spark.fit runs on engine 'spark', got {fields['engine']!r}")
    objects = label_functions(fields, "spark")  # a loss, metrics or optimizer given as objects
    fields["model"], source = _model_spec(model)
    objects = replace(objects, model=source)
    from ember.engines import DataFrameInput, ParsedRun, SparkEngine

    if df is not None and fields.get("data") is not None:
        raise ConfigError("pass either df or data to ember.spark.fit, not both")
    config = run_config(fields, config_file)
    if df is None and weight_col is not None:
        raise ConfigError("weight_col names a column of df: pass df to ember.spark.fit")
    frame = None
    if df is not None:
        frame = DataFrameInput(df, features_col, label_col, test_df, weight_col)
    return ParsedRun(
        config, objects, frame=frame, show_progress=show_progress, mlflow=mlflow
    ).execute(SparkEngine())


def _model_spec(model: str | Callable[..., Any]) -> tuple[str, Any]:
    """model_spec's name for what the workers can import; any other model object (a module,
    a lambda, a class or function of __main__) by a label, the object itself (returned
    beside it) travelling to the tasks in their closure, as Spark ships code."""
    importable = isinstance(model, str) or inspect.isfunction(model) or isinstance(model, type)
    module, name = getattr(model, "__module__", None), getattr(model, "__qualname__", "")
    if importable and (isinstance(model, str) or (module != "__main__" and "<" not in name)):
        return model_spec(model), None
    from ember.models import check_model_object

    check_model_object(model)
    return model_label(model), model


def model_spec(model: str | Callable[..., Any]) -> str:
    """A factory function as the "module:name" spec the workers import it by."""
    if isinstance(model, str):
        return model
    module, name = getattr(model, "__module__", None), getattr(model, "__qualname__", "")
    importable = inspect.isfunction(model) or isinstance(model, type)
    if importable and module and module != "__main__" and "<" not in name:
        return f"{module}:{name}"
    if not callable(model) or importable or "<" in name:  # a name's wrong kind, a lambda
        got = name or type(model).__name__
        raise ConfigError(
            "model must be a name, 'package.module:factory' or a module-level function that"
            f" Spark workers can import (not one defined in __main__ or a lambda); got {got}"
        )
    kind = type(model)  # an instance: its repr is the module's whole tree, said by its class
    module = kind.__module__ if kind.__module__ != "__main__" else "your_module"
    raise ConfigError(
        f"model is an instance of {kind.__qualname__}, which Spark ML cannot save with the"
        f" pipeline: pass its class as '{module}:{kind.__qualname__}' (built with input_shape="
        " and num_classes= where it takes them; a module the executors import, not the"
        " script): ML persistence writes params as JSON and pickles no module"
    )


def __getattr__(name: str) -> Any:
    # The estimator's classes subclass pyspark's, so their module imports pyspark and this one
    # cannot: it is loaded when first asked for (PEP 562), as ember loads this module.
    if name in ("EmberEstimator", "EmberModel"):
        return getattr(importlib.import_module("ember.spark_ml"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["fit"]  # and EmberEstimator, EmberModel, loaded on first use
