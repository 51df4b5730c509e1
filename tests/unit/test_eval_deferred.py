"""eval_deferred: worker 0 copies its parameters at each evaluation point and evaluates the
copies after training, with the figures an evaluation on the spot would have reported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ember.config import RunConfig
from ember.worker import loop as worker_module
from ember.worker.loop import WorkerSpec, run_worker
from ember_lab.bench.predict import _evaluations

MEASURED = ("epoch", "step", "samples", "test_accuracy", "test_loss", "source")


def _train(tmp_path: Path, deferred: bool) -> list[dict[str, Any]]:
    config = RunConfig(
        data="synthetic-lr",
        model="logreg",
        strategy="single",
        workers=1,
        epochs=3,
        batch_size=32,
        lr=0.5,
        synthetic_samples=640,
        synthetic_features=8,
        log_every=5,
        eval_every=4,
        eval_deferred=deferred,
    ).validate()
    reported: list[dict[str, Any]] = []
    spec = WorkerSpec(config, 0, 1, run_dir=str(tmp_path))
    run_worker(spec, lambda record: reported.append(record.to_json()))
    return reported


def _evals(reported: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [tuple(r[k] for k in MEASURED) for r in reported if r["kind"] == "eval"]


def test_deferred_evaluations_report_what_evaluations_on_the_spot_did(tmp_path: Path) -> None:
    on_the_spot = _train(tmp_path / "spot", deferred=False)
    deferred = _train(tmp_path / "deferred", deferred=True)
    expected = _evals(on_the_spot)
    assert len(expected) == 15  # every 4 steps and at each epoch's end, 20 steps an epoch
    assert len({accuracy for *_, accuracy, _, _ in expected}) > 1  # the model moved
    assert _evals(deferred) == expected
    kinds = [r["kind"] for r in deferred]
    # after training: no evaluation before the last progress record
    assert kinds.index("eval") > max(i for i, kind in enumerate(kinds) if kind == "worker")
    seconds = [r["seconds"] for r in deferred if r["kind"] == "eval"]
    assert seconds == sorted(seconds) and seconds[0] > 0


def test_deferred_copies_past_the_bound_are_evaluated_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_module, "SNAPSHOT_BYTES", 0)
    reported = _train(tmp_path, deferred=True)
    kinds = [r["kind"] for r in reported]
    assert kinds.index("eval") < kinds.index("worker")  # the first, at step 4, held nothing
    assert _evals(reported) == _evals(_train(tmp_path / "spot", deferred=False))


def test_deferred_evaluations_add_no_pause_to_the_prediction() -> None:
    config = {"workers": 2, "batch_size": 64, "epochs": 2, "eval_every": 4}
    assert _evaluations(config, 64 * 2 * 40) == 10
    assert _evaluations({**config, "eval_deferred": True}, 64 * 2 * 40) == 0
