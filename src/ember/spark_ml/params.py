"""The Params an EmberEstimator and its EmberModel share: Spark's column names and the run's."""

from __future__ import annotations

import copy
from typing import Any

import torch
from pyspark.ml.param import Param, Params, TypeConverters, shared

from ember.config import RunConfig
from ember.errors import ConfigError
from ember.spark import model_spec

# The run fields with a Param of their own, by Param name; the rest go in runFields.
OWN_FIELDS = {
    "strategy": "strategy",
    "workers": "workers",
    "workersMax": "workers_max",
    "epochs": "epochs",
    "lr": "lr",
    "tau": "tau",
    "batchSize": "batch_size",
    "loss": "loss",
}
# Not run fields at all: the estimator decides them.
_NOT_FIELDS = {"model", "engine", "data"}


def _to_model(value: Any) -> str | torch.nn.Module:
    """A module instance as itself (ember.spark.fit trains one: each task gets a copy), any
    other model as the spec its executors import it by ("module:name" for a function)."""
    return value if isinstance(value, torch.nn.Module) else model_spec(value)


def _to_fields(value: Any) -> dict[str, Any]:
    """runFields as a dict of RunConfig field names (dashes taken as underscores)."""
    if not isinstance(value, dict):
        raise TypeError(f"runFields must be a dict of run fields, got {value!r}")
    fields = {str(k).replace("-", "_"): v for k, v in value.items()}
    known = set(RunConfig.__dataclass_fields__) - _NOT_FIELDS - set(OWN_FIELDS.values())
    unknown = sorted(set(fields) - known)
    if unknown:
        own = {field: name for name, field in OWN_FIELDS.items()}
        hints = [f"{k} (use the {own[k]} param)" if k in own else k for k in unknown]
        raise ConfigError(
            f"runFields: not fields of a run, or set by a param of their own: {', '.join(hints)};"
            f" allowed: {', '.join(sorted(known))}"
        )
    return fields


class EmberParams(
    shared.HasFeaturesCol,
    shared.HasLabelCol,
    shared.HasPredictionCol,
    shared.HasProbabilityCol,
    shared.HasRawPredictionCol,
    shared.HasValidationIndicatorCol,
    shared.HasWeightCol,
):
    """featuresCol (an ML vector or a numeric array), labelCol, predictionCol (the class
    index, double; a regression's output), probabilityCol (the class probabilities, an ML
    vector; none for a regression), rawPredictionCol (the model's logits, an ML vector; none
    for a regression), validationIndicatorCol (true marks the rows the run is scored on;
    unset: a seeded tenth of the rows), weightCol (each row's weight in the loss, >= 0;
    unset: all 1, as Spark's own estimators), the model and the run's fields."""

    model: Param[str | torch.nn.Module] = Param(
        Params._dummy(),
        "model",
        "the model: a built-in name (mlp, logreg, lenet, cnn_bn), 'package.module:factory', a"
        " module-level factory function the executors can import, or an nn.Module",
        # a factory function is kept as the "module:name" its executors import it by, which
        # is also what ML persistence can write; a module instance it cannot (save() says so)
        typeConverter=_to_model,
    )
    strategy: Param[str] = Param(
        Params._dummy(), "strategy", "the training strategy", TypeConverters.toString
    )
    workers: Param[int] = Param(
        Params._dummy(),
        "workers",
        "workers, one Spark barrier task each; with workersMax, a worker range's MIN",
        TypeConverters.toInt,
    )
    workersMax: Param[int | None] = Param(
        Params._dummy(),
        "workersMax",
        "a worker range's MAX: members (ordinary tasks, no barrier) join and leave while the"
        " run goes on, as executors come and go; unset: a fixed run of workers",
        lambda value: None if value is None else TypeConverters.toInt(value),
    )
    epochs: Param[int] = Param(Params._dummy(), "epochs", "passes", TypeConverters.toInt)
    lr: Param[float] = Param(Params._dummy(), "lr", "learning rate", TypeConverters.toFloat)
    tau: Param[int] = Param(
        Params._dummy(), "tau", "easgd: local steps between exchanges", TypeConverters.toInt
    )
    batchSize: Param[int] = Param(
        Params._dummy(), "batchSize", "per-worker minibatch", TypeConverters.toInt
    )
    loss: Param[str] = Param(
        Params._dummy(),
        "loss",
        "the loss: cross_entropy (labels are classes), mse, l1, huber (values),"
        " bce_with_logits or package.module:function",
        TypeConverters.toString,
    )
    mlflow: Param[bool] = Param(
        Params._dummy(),
        "mlflow",
        "log each fit to an MLflow run of its own (unset: when an MLflow run is active)",
        TypeConverters.toBoolean,
    )
    runFields: Param[dict[str, Any]] = Param(
        Params._dummy(),
        "runFields",
        "any other field of ember.spark.fit, as a dict (servers, alpha, optimizer, out, seed,...)",
        typeConverter=_to_fields,
    )

    def __init__(self) -> None:
        super().__init__()
        defaults = RunConfig()
        self._setDefault(
            featuresCol="features",
            labelCol="label",
            predictionCol="prediction",
            probabilityCol="probability",
            rawPredictionCol="rawPrediction",
            model=defaults.model,
            runFields={},
            **{name: getattr(defaults, field) for name, field in OWN_FIELDS.items()},
        )

    def set_params(self, params: dict[str, Any]) -> Any:
        """Set Params by name, refusing one this class does not have with its list."""
        names = sorted(p.name for p in self.params)
        unknown = sorted(set(params) - set(names))
        if unknown:
            raise ConfigError(
                f"{type(self).__name__} has no param {', '.join(map(repr, unknown))};"
                f" its params: {', '.join(names)}"
            )
        return self._set(**params)

    def model_source(self) -> str | torch.nn.Module:
        """What builds the model: its spec, or a copy of the module instance it was given, so
        that loading weights into it leaves the param's own module as it was."""
        model = self.getOrDefault(self.model)
        return copy.deepcopy(model) if isinstance(model, torch.nn.Module) else str(model)

    def check_persistable(self) -> None:
        """Spark ML persistence writes params as JSON and pickles nothing: a module instance
        is refused by the spec it would need, which names what to pass instead."""
        model_spec(self.getOrDefault(self.model))

    def run_fields(self) -> dict[str, Any]:
        """The fields of ember.spark.fit these Params give, model and columns aside."""
        own = {field: self.getOrDefault(name) for name, field in OWN_FIELDS.items()}
        fields: dict[str, Any] = self.getOrDefault("runFields")
        return {**fields, **own}


def _add_accessors(cls: type) -> None:
    """`setX(value)` for every Param X and `getX()` for each that lacks one, as Spark's own
    estimators and models have them (LogisticRegression().setLabelCol("y").setMaxIter(5));
    each setter returns the stage, so they chain."""

    def setter(name: str) -> Any:
        def set_param(self: Params, value: Any) -> Any:
            return self._set(**{name: value})

        set_param.__doc__ = f"Sets the value of :py:attr:`{name}`."
        return set_param

    def getter(name: str) -> Any:
        def get_param(self: Params) -> Any:
            return self.getOrDefault(name)

        get_param.__doc__ = f"Gets the value of {name} or its default value."
        return get_param

    for name in sorted(n for n in dir(cls) if isinstance(getattr(cls, n, None), Param)):
        title = name[0].upper() + name[1:]
        for prefix, make in (("set", setter), ("get", getter)):
            if not hasattr(cls, prefix + title):
                setattr(cls, prefix + title, make(name))


_add_accessors(EmberParams)
