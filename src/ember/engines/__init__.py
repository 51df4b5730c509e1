"""Engines: where workers and servers run.

Map:
- ParsedRun -> parsed.py: a run as the edge parsed it; `execute(engine)`, its one path to a
  finished run on every engine
- LocalEngine, SparkEngine, engine_named -> engine.py: the engines, by config.engine's name
- train_local -> local.py: spawned server and worker processes on this machine
- RecordPipes, RecordSender -> recordpipes.py: each local worker's records, on a pipe of its own
- train_spark, train_dataframe -> spark/: one Spark barrier task per worker, servers by the
  driver (its session, jobs, task body and JVM options: see its own docstring)
- ServerGroup -> servers.py: the server processes, their replicas, restarts, checkpoints, shutdown
- join_run, write_join_file -> join.py: `ember join`, a worker added to a running async run
- RunSetup, RunResult, prepare_run, finish_run -> rundir.py: a run's directory opened (data,
  starting parameters, resume) and closed (final evaluation, summary.json)
- NoModel, LoopResult, finish_loop -> userrun.py: ember.run's launcher side (no model of its
  own, summary.json for a loop the user wrote, rank 0's return value)
- Run -> run.py: one run lifecycle for both engines (servers kept alive and checkpointed,
  events relayed, what the servers hold saved on failure)
- start_child, Interpreter, reap -> process.py: children (spawned workers, servers as fresh
  interpreters) tied to the launcher's life
- server_main.py: `python -m ember.engines.server_main`, one parameter-server process
- Placement, placement, bind_first -> addresses.py: where listeners bind (--bind-address,
  --ports) and what workers are told (--advertise-address)
- Progress -> progress.py: the live progress bar
- Timeline, PeakMemory -> phases.py: the summary's phase timings and the processes' peak memory
- forking.py: the workers' fork server, started first: the local launcher never imports torch
- ModelWork, Forked, InProcess -> modelwork.py: the starting parameters and final evaluation,
  in a fork of the fork server (local) or in the driver's process (Spark)
- forkserver.py: imported by the workers' fork server alone, which then dies with the launcher

imports: _version, algorithms, checkpoint, config, data, errors, export, metrics, models, ps,
  userfile, wire, worker
"""

from __future__ import annotations

from typing import Any

from ember.engines.engine import LocalEngine, SparkEngine, engine_named
from ember.engines.parsed import DataFrameInput, Engine, ParsedRun


def __getattr__(name: str) -> Any:
    # rundir.py brings the run's checkpoints, servers and wire, which `python -m
    # ember.engines.server_main` imports this package without needing (PEP 562)
    if name == "RunResult":
        from ember.engines.rundir import RunResult

        return RunResult
    raise AttributeError(f"module 'ember.engines' has no attribute {name!r}")


__all__ = [
    "DataFrameInput",
    "Engine",
    "LocalEngine",
    "ParsedRun",
    "RunResult",
    "SparkEngine",
    "engine_named",
]
