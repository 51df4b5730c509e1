"""`ember.run(train_fn, ...)`: the user's own training loop on every worker of a run, as
TorchDistributor.run and horovod.spark.run run it, with rank 0's return value back.

imports: api, config, engines, errors, metrics, worker
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ember.api import in_python_terms, run_config, take_objects
from ember.config import RunConfig, explicit_fields
from ember.engines.script import ShippedLoop, require_main_guard
from ember.errors import ConfigError, EmberError
from ember.metrics.records import Returned

if TYPE_CHECKING:
    from ember.engines import DataFrameInput


@in_python_terms
def run(
    train_fn: Callable[..., Any] | str | Path,
    *args: Any,
    config_file: str | None = None,
    show_progress: bool | None = None,
    test_data: tuple[Any, Any] | None = None,
    **fields: Any,
) -> Any:
    """Run `train_fn(*args)` on every worker, with the run's servers started and stopped
    around it, and return rank 0's return value. `fields` are ember.fit's (workers=,
    strategy=, engine=, data=, lr=, optimizer=, tau=, ...). Inside, ember.context() gives the
    rank, the worker count, this worker's shard of `data` and report(); ember.Optimizer wraps
    the loop's torch.optim optimizer so that its step() does the run's exchange. Under
    strategy="allreduce" (and "single") each worker has torchrun's variables (RANK,
    WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so a loop written for TorchDistributor
    (init_process_group, DDP, DistributedSampler) runs unchanged; `train_fn` may also be the
    path of a .py script, run on every worker as `python train_fn *args` (returning None),
    as TorchDistributor.run takes one. On engine="spark" `data` may be a DataFrame, each task
    reading its partition (ctx.data). Strategies
    with servers need `model=` (the module train_fn trains, or a function building it): the
    servers start from its parameters. The value travels as msgpack (numbers, strings,
    bytes, lists, dicts, None, NumPy arrays, torch tensors), never pickled. Progress shows
    on a terminal (show_progress=None), as ember.fit's does."""
    from ember.engines import ParsedRun, engine_named
    from ember.worker.spec import UserLoop
    from ember.worker.torchrun import ScriptFile

    if isinstance(train_fn, str | Path):
        train_fn = ScriptFile.read(train_fn)
    elif not callable(train_fn):
        kind = type(train_fn).__name__
        raise ConfigError(f"ember.run runs a function or a .py script on every worker; got {kind}")
    fields = {k.replace("-", "_"): v for k, v in fields.items()}
    has_model = fields.get("model") is not None
    if not has_model:
        fields.pop("model", None)
    frame = spark_frame(fields, test_data)
    dataset, objects = take_objects(fields, None if frame else test_data)
    config = run_config(fields, config_file)
    check_run(config, has_model)
    if frame is not None and config.engine != "spark":
        raise ConfigError("ember.run on a Spark DataFrame runs on engine='spark'")
    if config.engine == "local":  # the function goes to spawned processes, as a model does
        require_main_guard("ember.run", "its workers")
        train_fn, args = ShippedLoop(train_fn, tuple(args)), ()
    has_data = frame is not None or "data" in explicit_fields(fields, config_file)
    if not has_data and has_model:  # a loop that reads its own data, as TorchDistributor's do
        print(
            f"ember: ember.run was given no data=: the loop reads its own, so model= is not"
            f" tried on rows before the start (ctx.data serves {config.data})",
            file=sys.stderr,
        )
    loop = UserLoop(train_fn, tuple(args), has_model, has_data)
    run = ParsedRun(config, objects, dataset, frame=frame, loop=loop, show_progress=show_progress)
    result = run.execute(engine_named(config.engine))
    return returned_value(getattr(result, "returned", None), result.run_dir)


def spark_frame(fields: dict[str, Any], test_data: Any) -> DataFrameInput | None:
    """data= given as a Spark DataFrame (features, label; features_col= and label_col= name
    others), taken out of `fields`: each task's loop reads its partition through ctx.data, as
    ember.spark.fit's do. test_data= may be another DataFrame."""
    data = fields.get("data")
    if not type(data).__module__.startswith("pyspark.sql"):
        return None
    from ember.engines import DataFrameInput

    del fields["data"]
    features, label = fields.pop("features_col", "features"), fields.pop("label_col", "label")
    return DataFrameInput(data, features, label, test_data, fields.pop("weight_col", None))


def check_run(config: RunConfig, has_model: bool) -> None:
    """What ember.run cannot do with `config`: one clear error before anything starts."""
    if config.uses_server and not has_model:
        raise ConfigError(
            f"ember.run with strategy {config.strategy!r} needs model= (the module train_fn"
            " trains, or a function building it): the parameter servers start from its"
            " parameters; strategies single and allreduce run without one"
        )
    if config.tau_policy == "loss":
        raise ConfigError(
            "ember.run takes a fixed tau or tau 'auto' (ember.Optimizer times each step);"
            " tau 'loss' follows the built-in loop's losses"
        )


def returned_value(record: Returned | None, run_dir: Any) -> Any:
    """Rank 0's return value out of the record its worker sent, or its one clear error."""
    from ember.worker.returns import decode

    if record is None:
        raise EmberError(f"ember.run: rank 0 finished without returning a value (see {run_dir})")
    if record.error is not None or record.value is None:
        raise EmberError(record.error or "ember.run: rank 0 returned no value")
    return decode(base64.b64decode(record.value))


__all__ = ["run"]
