"""The Python API: `ember.fit(...)` takes the CLI's fields and returns summary and model.

imports: checkpoint, config, data, engines, errors, export, models, worker
"""

from __future__ import annotations

import functools
import sys
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ember.config import RunConfig, explicit_fields, fresh_config, resumed_values
from ember.config.flags import in_python_terms as python_words
from ember.config.objects import OBJECT_PREFIX, UserObjects, model_label, object_label
from ember.engines.script import check_picklable, require_main_guard
from ember.errors import ConfigError

if TYPE_CHECKING:
    from ember.data import Dataset


F = TypeVar("F", bound=Callable[..., Any])


def in_python_terms(api: F) -> F:
    """A ConfigError out of `api` in the words of its caller, keywords where config's
    messages name `ember train`'s flags (`--tau auto` as `tau="auto"`)."""

    @functools.wraps(api)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return api(*args, **kwargs)
        except ConfigError as exc:
            raise type(exc)(python_words(str(exc))) from None

    return call  # type: ignore[return-value]


@in_python_terms
def fit(
    config_file: str | None = None,
    show_progress: bool | None = None,
    test_data: tuple[Any, Any] | None = None,
    mlflow: bool | None = None,
    **fields: Any,
) -> Any:
    """Train with the same fields as `ember train` (e.g. model="mlp", strategy="bsp",
    workers=4); returns a RunResult with `.summary`, `.model` and `.run_dir`. `model` may
    also be an nn.Module (copied, with its own initial parameters) or a callable returning
    one (called with input_shape= and num_classes= if it takes them); `data` an (x, y) pair
    of arrays or CPU tensors, and `test_data` another (without it, the last tenth of `data`
    is held out for testing). Objects reach the workers as the engine ships code to its own
    processes, never over ember's wire. `show_progress`: the start-up phases, a progress bar
    and a line per epoch on stderr; None (the default) shows them on a terminal only.
    `mlflow`: log the run to MLflow (one MLflow run: params, epoch metrics, the model); None
    does so when an MLflow run is active."""
    from ember.engines import ParsedRun, engine_named

    fields = {k.replace("-", "_"): v for k, v in fields.items()}
    dataset, objects = take_objects(fields, test_data)
    config = run_config(fields, config_file)
    if config.engine == "local":  # Spark's workers and ember's servers never import __main__
        require_main_guard("ember.fit", "its workers")
    run = ParsedRun(config, objects, dataset, show_progress=show_progress, mlflow=mlflow)
    return run.execute(engine_named(config.engine))


def take_objects(
    fields: dict[str, Any], test_data: tuple[Any, Any] | None
) -> tuple[Dataset | None, UserObjects]:
    """Data given as arrays, and a model, loss, metrics, optimizer or schedule given as
    objects, taken out of `fields` (which then hold their names and labels): the dataset to
    train on, if arrays were given, and the objects."""
    engine = fields.get("engine", "local")
    objects = label_functions(fields, engine)
    dataset = None
    if not isinstance(fields.get("data", ""), (str, Path)):
        from ember.config.objective import targets_of
        from ember.data.files import arrays_dataset

        targets = targets_of(fields.get("loss", "cross_entropy"))
        dataset = arrays_dataset(fields.pop("data"), test_data, targets=targets)
        fields["data"] = dataset.name  # what summary.json and checkpoints name
    elif test_data is not None:
        raise ConfigError("test_data goes with data given as arrays; a data path holds its own")
    elif isinstance(fields.get("data"), Path):
        fields["data"] = str(fields["data"])
    if not isinstance(fields.get("model", ""), str):  # a module or a function building one
        from ember.models import check_model_object

        source = fields.pop("model")
        check_model_object(source)
        fields["model"] = model_label(source)
        objects = replace(objects, model=source)
        if engine == "local":
            check_picklable(source)
    return dataset, objects


def label_functions(fields: dict[str, Any], engine: str) -> UserObjects:
    """A loss given as a callable or nn.Module, metrics given as callables (or a list of names
    and callables), an optimizer as a torch.optim class or a callable building one from the
    parameters, and a schedule as a callable building one from the optimizer, become names
    and labels in the run's fields; the objects, returned by label, travel as models do."""
    functions: dict[str, Any] = {}

    def label(kind: str, source: object) -> str:
        if isinstance(source, str):
            return source
        if not callable(source):
            raise ConfigError(f"{kind} must be a name or a callable, got {type(source).__name__}")
        name = object_label(kind, source)
        functions[name] = source
        if engine == "local":
            check_picklable(source, kind)
        return name

    if "loss" in fields and fields["loss"] is not None:
        fields["loss"] = label("loss", fields["loss"])
    optimizer = fields.get("optimizer")
    if isinstance(optimizer, type):  # a torch.optim class: by its name, as the CLI gives it
        fields["optimizer"] = optimizer.__name__.lower()
    elif optimizer is not None:
        fields["optimizer"] = label("optimizer", optimizer)  # params -> torch.optim.Optimizer
    if fields.get("scheduler") is not None:
        fields["scheduler"] = label("scheduler", fields["scheduler"])  # optimizer -> LRScheduler
    metrics = fields.get("metrics")
    if metrics is not None and not isinstance(metrics, str):
        listed = list(metrics) if isinstance(metrics, (list, tuple)) else [metrics]
        fields["metrics"] = ",".join(label("metric", m) for m in listed)
    return UserObjects(functions=functions)


def run_config(overrides: dict[str, Any], config_file: str | None = None) -> RunConfig:
    """`make_config`, except that a run resumed from a checkpoint keeps the configuration
    saved with it: explicit fields may change only what `resumed_values` allows."""
    explicit = explicit_fields(overrides, config_file)
    if explicit.get("resume") is None:
        return fresh_config(explicit)
    # Only here: a fresh run's configuration needs none of the run directory's machinery
    # (checkpoints, servers, the wire), so `ember train` does not import it before it must.
    from ember.engines.rundir import resolve_resume

    probe = RunConfig(out=explicit.get("out"), resume=explicit["resume"]).validate()
    with warnings.catch_warnings():  # prepare_run looks again and warns of a bad checkpoint
        warnings.simplefilter("ignore")
        checkpoint = resolve_resume(probe, probe.run_dir() / "checkpoints")
    if checkpoint is None:  # --resume auto in a run directory without checkpoints: start afresh
        return fresh_config(explicit)
    values, changed = resumed_values(checkpoint.meta.get("config"), explicit, str(checkpoint.path))
    config = RunConfig(**values).validate()
    if changed:
        print(f"ember: resuming from {checkpoint.path}: {', '.join(changed)}", file=sys.stderr)
    return config


def evaluate_checkpoint(
    checkpoint: str | Path,
    data: str | None = None,
    model: str | None = None,
    loss: str | None = None,
) -> dict[str, Any]:
    """Load a checkpoint (a step directory or a run's checkpoints folder) and score its
    parameters on the test split of `data` (default: the data it was trained on).

    A checkpoint is a user's file: a model factory it names is imported only when the caller
    names the same factory in `model`, never on the file's word alone; a model or loss the
    run was handed as an object is named again as "module:Name" (`model`, `loss`)."""
    from ember.checkpoint import load_checkpoint, verify_run_state
    from ember.data.datasets import scored_rows
    from ember.data.files import ARRAYS
    from ember.errors import CheckpointError
    from ember.export import fill_from_checkpoint
    from ember.models import MODEL_NAMES
    from ember.worker.evaluation import evaluate
    from ember.worker.loop import make_model
    from ember.worker.spec import load_data

    loaded = verify_run_state(load_checkpoint(Path(checkpoint)))
    saved = loaded.meta.get("config", {})
    try:
        fields = {k: v for k, v in saved.items() if k in RunConfig.__dataclass_fields__}
        config = RunConfig(**{k: v for k, v in fields.items() if k not in ("out", "resume")})
        config.validate()
    except ConfigError as exc:
        raise CheckpointError(
            f"checkpoint {loaded.path / 'manifest.json'}: meta.config is invalid: {exc}"
        ) from None
    sources = loaded.meta.get("sources") or {}
    if data is not None:
        config.data = data
    elif config.data == ARRAYS:
        raise ConfigError(
            f"checkpoint {loaded.path} was trained on in-memory arrays; pass --data FILE (a"
            " .npz or .parquet file of such rows) to score it"
        )
    if model is not None:
        config.model = model
    elif config.model not in MODEL_NAMES:
        raise ConfigError(
            f"checkpoint {loaded.path} was trained with {_named(config.model, sources)}; pass"
            f" --model {sources.get(config.model, config.model)} to import and run it"
        )
    if loss is not None:
        config.loss = loss
    elif config.loss.startswith(OBJECT_PREFIX):
        where = sources.get(config.loss, "module:Name")
        raise ConfigError(
            f"checkpoint {loaded.path} was trained with {_named(config.loss, sources)}; pass"
            f" --loss {where} to import and score with it"
        )
    if any(m.startswith(OBJECT_PREFIX) for m in (config.metrics or "").split(",")):
        config.metrics = None  # the run's own metric objects: its loss's metrics instead
    dataset = load_data(config)
    network = make_model(config.model, config.seed, dataset)
    fill_from_checkpoint(network, loaded)
    # a file named here holds new rows: all of it is scored unless it has a test split
    x, y, split = scored_rows(dataset, whole=data is not None)
    scores = evaluate(network, x, y, config.loss, config.metrics)
    return {
        "checkpoint": str(loaded.path),
        "data": config.data,
        "model": config.model,
        "rows": len(y),
        "split": split,
        **scores,
        "step": loaded.step,
    }


def _named(label: str, sources: dict[str, str]) -> str:
    """How an error names what a run was trained with: a factory, or an object and where."""
    if not label.startswith(OBJECT_PREFIX):
        return f"model factory {label!r}"
    what = "a loss object" if label.startswith(OBJECT_PREFIX + "loss:") else "a model object"
    return f"{what} ({sources.get(label, label.removeprefix(OBJECT_PREFIX))})"
