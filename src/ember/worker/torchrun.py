"""What a loop written for torchrun or TorchDistributor finds on an ember.run worker: the env://
variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...) under the strategies without
servers, so that `dist.init_process_group("gloo")`, DDP and DistributedSampler run unchanged;
and a script file run as `python train.py ARGS` would run it, as TorchDistributor.run("train.py",
ARGS) does.

Under the strategies with servers the variables are not set: the loop trains through
ember.Optimizer there, and a call of init_process_group is refused with that one line.
"""

from __future__ import annotations

import os
import runpy
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ember.config.devices import Placement
from ember.errors import ConfigError
from ember.worker.spec import WorkerSpec

# torch's own words when env:// misses a variable (torch/distributed/rendezvous.py)
_ENV_RENDEZVOUS = "env:// rendezvous"


def torchrun_variables(spec: WorkerSpec, placement: Placement) -> dict[str, str]:
    """torchrun's variables for this worker. Its rendezvous is the run's: on the local engine
    127.0.0.1 and a port the launcher chose, where rank 0's init_process_group opens the store;
    on Spark the store rank 0's task opened already (on its executor's host, through --ports),
    which every rank joins as a client, as torchrun's workers join their agent's store."""
    host, port = spec.rendezvous.removeprefix("tcp://").rsplit(":", 1)
    on_spark = spec.gpus is not None  # a Spark task; the local engine's workers share a host
    if placement.cuda:  # the GPU ember placed this worker on: torch.cuda.set_device(LOCAL_RANK)
        local_rank, local_world = int(placement.device.split(":")[1]), spec.world
    else:
        local_rank, local_world = (0, 1) if on_spark else (spec.rank, spec.world)
    variables = {
        "RANK": spec.rank,
        "WORLD_SIZE": spec.world,
        "LOCAL_RANK": local_rank,
        "LOCAL_WORLD_SIZE": local_world,
        "GROUP_RANK": spec.rank if on_spark else 0,  # torchrun's node rank: a task is a node
        "GROUP_WORLD_SIZE": spec.world if on_spark else 1,
        "MASTER_ADDR": host,
        "MASTER_PORT": port,
        "TORCHELASTIC_RESTART_COUNT": 0,
    }
    if spec.store is not None:
        variables["TORCHELASTIC_USE_AGENT_STORE"] = True
    return {name: str(value) for name, value in variables.items()}


@contextmanager
def torchrun_environment(spec: WorkerSpec, placement: Placement) -> Iterator[None]:
    """The block runs with torchrun's variables set (and those before it restored after: a
    Spark executor's Python worker, or the launcher's own process, runs more than one), or,
    under a strategy with servers, with a call of init_process_group refused in ember's words."""
    strategy = spec.parts.strategy
    if strategy.uses_server:
        try:
            yield
        except ValueError as exc:
            if _ENV_RENDEZVOUS not in str(exc):
                raise
            raise ConfigError(
                f"strategy {strategy.strategy!r} trains through the parameter servers, with"
                " ember.Optimizer wrapping the loop's optimizer; this function called"
                " torch.distributed.init_process_group, which has no group to join under it."
                " Run a torch.distributed loop (DDP, DistributedSampler) with"
                " strategy='allreduce', or drop DDP and wrap its optimizer in ember.Optimizer"
            ) from None
        return
    import torch.distributed as dist

    from ember.algorithms.allreduce import settled

    variables = torchrun_variables(spec, placement)
    before = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    destroy = dist.destroy_process_group
    dist.destroy_process_group = settled(destroy)  # the loop's own call, as the module has it
    try:
        yield
    finally:
        dist.destroy_process_group = destroy
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@dataclass(frozen=True)
class ScriptFile:
    """A training script ember.run runs on every worker as `python PATH ARGS` would: as
    __main__, with sys.argv set. Its text travels with the run, so an executor on a host
    without the file runs the driver's copy; the modules it imports must be there already."""

    path: str
    source: str

    @classmethod
    def read(cls, path: str | Path) -> ScriptFile:
        file = Path(path)
        if file.suffix != ".py" or not file.is_file():
            raise ConfigError(
                f"ember.run: {str(path)!r} is not a Python file; pass a training function or"
                " the path of a .py script"
            )
        return cls(str(file.resolve()), file.read_text())

    def __call__(self, *args: Any) -> None:
        argv = sys.argv
        sys.argv = [self.path, *(str(arg) for arg in args)]  # as TorchDistributor passes them
        sys.path.insert(0, str(Path(self.path).parent))  # its own folder first, as python's
        try:
            with self._here() as path:
                runpy.run_path(path, run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (None, 0):
                raise RuntimeError(f"{self.path} exited with status {exc.code}") from None
        finally:
            sys.argv = argv
            sys.path.remove(str(Path(self.path).parent))

    @contextmanager
    def _here(self) -> Iterator[str]:
        """The script's path on this host: its own where the same text is there, else a copy."""
        mine = Path(self.path)
        if mine.is_file() and mine.read_text() == self.source:
            yield self.path
            return
        with tempfile.TemporaryDirectory(prefix="ember-script-") as folder:
            copy = Path(folder) / mine.name
            copy.write_text(self.source)
            yield str(copy)
