"""The launcher's side of `ember.run`: a run without a model of its own to build, and its end,
where summary.json says what applies to a loop the user wrote and rank 0's value comes back."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ember._version import __version__
from ember.config import RunConfig
from ember.data import Dataset
from ember.engines.rundir import RunResult, RunSetup, run_facts
from ember.metrics import count_dealt_rows, summarize_workers, write_json
from ember.metrics.records import Returned, RunEvent


class NoModel:
    """ModelWork for a run given no model= (single, allreduce): the user's function builds
    its model on the workers, so the launcher has no starting parameters and none to score."""

    def initial(self, config: RunConfig, dataset: Dataset) -> tuple[np.ndarray, int]:
        return np.zeros(0, np.float32), 0

    def evaluate(
        self,
        config: RunConfig,
        dataset: Dataset,
        params: np.ndarray,
        export: Path | None,
        score: bool = True,
    ) -> dict[str, float]:
        raise AssertionError("ember.run does not evaluate a model of its own")


@dataclass
class LoopResult(RunResult):
    """A finished ember.run: the summary, and the record carrying rank 0's return value
    (None when rank 0 never returned one)."""

    returned: Returned | None = None


def finish_loop(
    setup: RunSetup,
    params: np.ndarray | None,
    workers: list[dict[str, Any]],
    seconds: float,
    extra: dict[str, Any],
    returned: Returned | None,
) -> LoopResult:
    """summary.json for a loop the user wrote: no test evaluation (the loop evaluates what
    it wants, and returns it), the servers' final `params` kept as the last checkpoint and,
    where the run knows the model (model= given), exported as model.safetensors."""
    config = setup.config
    exported = False
    if params is not None and params.size > 0 and not isinstance(setup.work, NoModel):
        setup.work.evaluate(config, setup.dataset, params, setup.run_dir, score=False)
        exported = True
    summary = {
        **run_facts(config),
        "data": config.data,
        "user_loop": True,
        "model_file": "model.safetensors" if exported else None,
        "parameters": setup.layout.parameters,
        "buffers": setup.layout.buffers,
        **summarize_workers(workers, seconds),
        "resumed_from": str(setup.resume.path) if setup.resume else None,
        "ember_version": __version__,
        **extra,
        "config": config.to_dict(),
    }
    count_dealt_rows(summary)
    write_json(setup.run_dir / "summary.json", summary)
    setup.metrics.write(RunEvent(event="finished", details={"returned": returned is not None}))
    setup.metrics.close()
    params = params if params is not None else np.zeros(0, np.float32)
    return LoopResult(summary, setup.run_dir, config, setup.shape, params, setup.objects, returned)
