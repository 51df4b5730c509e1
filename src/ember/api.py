"""The Python API: `ember.fit(...)` takes the CLI's fields and returns summary and model.

imports: checkpoint, config, data, engines, errors, export, metrics, models, worker
"""

from __future__ import annotations

import ast
import sys
import warnings
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from ember.config import RunConfig, explicit_fields, fresh_config, resumed_values
from ember.errors import ConfigError

if TYPE_CHECKING:
    from ember.data import Dataset


def fit(
    config_file: str | None = None,
    show_progress: bool = False,
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
    processes, never over ember's wire. `mlflow`: log the run to MLflow (one MLflow run:
    params, epoch metrics, the model); None does so when an MLflow run is active."""
    from ember.engines import train
    from ember.metrics.tracking import tracked

    fields = {k.replace("-", "_"): v for k, v in fields.items()}
    dataset = take_objects(fields, test_data)
    config = run_config(fields, config_file)
    if config.engine == "local":  # Spark's workers and ember's servers never import __main__
        require_main_guard("ember.fit", "its workers")
    return tracked(mlflow, config, lambda: train(config, show_progress, dataset))


def take_objects(fields: dict[str, Any], test_data: tuple[Any, Any] | None) -> Dataset | None:
    """Data given as arrays, and a model, loss, metrics, optimizer or schedule given as
    objects, taken out of `fields` (which then hold their names and labels): the dataset to
    train on, if arrays were given."""
    engine = fields.get("engine", "local")
    label_functions(fields, engine)
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
        from ember.models import model_label, register_model

        source = fields.pop("model")
        fields["model"] = model_label(source)
        register_model(fields["model"], source)
        if engine == "local":
            check_picklable(source)
    return dataset


def label_functions(fields: dict[str, Any], engine: str) -> None:
    """A loss given as a callable or nn.Module, metrics given as callables (or a list of names
    and callables), an optimizer as a torch.optim class or a callable building one from the
    parameters, and a schedule as a callable building one from the optimizer, become names
    and labels in the run's fields; the objects travel as models do."""
    from ember.models.losses import object_label, register_object

    def label(kind: str, source: object) -> str:
        if isinstance(source, str):
            return source
        if not callable(source):
            raise ConfigError(f"{kind} must be a name or a callable, got {type(source).__name__}")
        name = object_label(kind, source)
        register_object(name, source)
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


def check_picklable(source: object, what: str = "model") -> None:
    """The local engine hands a model, loss or metric object (or ember.run's function) to its
    worker processes as multiprocessing hands any argument: one it cannot is refused here,
    before anything starts."""
    from multiprocessing.reduction import ForkingPickler

    try:
        ForkingPickler.dumps(source)
    except Exception as exc:
        raise ConfigError(
            f"{what} {source!r} cannot be handed to the local engine's workers ({exc}); define"
            " it at the top level of a module (or of the script, under its main guard)"
        ) from None


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


def require_main_guard(caller: str, spawned: str) -> None:
    """Refuse a call from a script's top-level code outside `if __name__ == "__main__":`,
    before anything starts: the spawned processes import the script again and would call
    it again. In such a process (importing the script as __mp_main__) exit with that line."""
    main = sys.modules.get("__main__")
    main_globals = getattr(main, "__dict__", None)
    frame: FrameType | None = sys._getframe(1)
    outer = None
    while frame is not None:
        if frame.f_code.co_name == "<module>":
            if frame.f_globals.get("__name__") == "__mp_main__":
                raise SystemExit(
                    _unguarded(caller, spawned, frame.f_code.co_filename, frame.f_lineno)
                )
            if frame.f_globals is main_globals:
                outer = frame  # the outermost one wins: that is the script's own code
        frame = frame.f_back
    path = getattr(main, "__file__", None)
    if outer is None or not path:  # a REPL, python -c, a notebook: nothing re-imports them
        return
    try:
        tree = ast.parse(Path(path).read_bytes())
    except (OSError, SyntaxError, ValueError):  # not readable as source: let it run
        return
    if not any(_guards(node, outer.f_lineno) for node in ast.walk(tree)):
        raise ConfigError(_unguarded(caller, spawned, path, outer.f_lineno))


def _guards(node: ast.AST, line: int) -> bool:
    """Whether `node` is `if __name__ == "__main__":` (either way round) whose body holds line."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    test = node.test
    if len(test.comparators) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = {ast.unparse(test.left), ast.unparse(test.comparators[0])}
    if sides != {"__name__", "'__main__'"}:
        return False
    return node.body[0].lineno <= line <= (node.body[-1].end_lineno or line)


def _unguarded(caller: str, spawned: str, path: str, line: int) -> str:
    script = Path(path).name
    return (
        f"{caller} was called at the top level of {script} (line {line}); {spawned}"
        f" are spawned processes that import {script} again, so put the call under"
        ' `if __name__ == "__main__":`'
    )


def evaluate_checkpoint(
    checkpoint: str | Path, data: str | None = None, model: str | None = None
) -> dict[str, Any]:
    """Load a checkpoint (a step directory or a run's checkpoints folder) and score its
    parameters on the test split of `data` (default: the data it was trained on).

    A checkpoint is a user's file: a model factory it names is imported only when the caller
    names the same factory in `model`, never on the file's word alone."""
    from ember.checkpoint import load_checkpoint, verify_run_state
    from ember.data.datasets import scored_rows
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
    if data is not None:
        config.data = data
    if model is not None:
        config.model = model
    elif config.model not in MODEL_NAMES:
        raise ConfigError(
            f"checkpoint {loaded.path} was trained with model factory {config.model!r}; pass "
            f"--model {config.model} to import and run it"
        )
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
