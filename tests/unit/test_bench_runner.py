"""How `ember bench` lays out its rows, checks its settings and derives divergence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ember.config import STRATEGIES
from ember.errors import ConfigError
from ember_lab.bench.rows import BenchSettings, make_tasks, plan_rows
from ember_lab.bench.runner import add_divergence


def test_rows_are_mllib_then_every_strategy_then_the_sweep(tmp_path: Path) -> None:
    settings = BenchSettings(out=tmp_path, tasks=["lr", "mlp"], taus=[1, 8], sweep_tasks=["mlp"])
    rows = plan_rows(settings, make_tasks(False, 1000, 10))
    labels = [(r.task.name, r.label) for r in rows]
    expected_lr = [("lr", "mllib"), *(("lr", s) for s in STRATEGIES)]
    assert labels[: len(expected_lr)] == expected_lr
    assert labels[-2:] == [("mlp", "easgd-async tau=1"), ("mlp", "easgd-async tau=8")]
    single = next(r for r in rows if r.label == "single")
    assert single.config is not None and single.config.workers == 1
    sweep = [r for r in rows if r.sweep]
    assert [r.config.tau for r in sweep if r.config] == [1, 8]
    lr = next(r for r in rows if r.task.name == "lr" and r.config)
    assert lr.config is not None and lr.config.synthetic_samples == 1000


def test_spark_engine_rows_are_labelled(tmp_path: Path) -> None:
    settings = BenchSettings(
        out=tmp_path, tasks=["mlp"], strategies=["bsp"], engines=["local", "spark"], mllib=False
    )
    rows = plan_rows(settings, make_tasks(True, 1000, 10))
    assert [(r.label, r.engine) for r in rows if not r.sweep] == [
        ("bsp", "local"),
        ("bsp (spark)", "spark"),
    ]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("tasks", ["resnet"], "unknown task resnet"),
        ("strategies", ["fast"], "unknown strategy fast"),
        ("engines", ["yarn"], "unknown engine yarn"),
        ("sweep_tasks", ["x"], "unknown sweep task x"),
    ],
)
def test_unknown_names_are_refused_before_anything_runs(
    tmp_path: Path, field: str, value: list[str], message: str
) -> None:
    settings = BenchSettings(out=tmp_path, **{field: value})
    with pytest.raises(ConfigError, match=message):
        settings.validate(make_tasks(True, 1000, 10))


def test_an_earlier_benchmark_is_never_overwritten(tmp_path: Path) -> None:
    (tmp_path / "results.jsonl").write_text('{"kind": "row"}\n')
    with pytest.raises(ConfigError, match="already holds"):
        BenchSettings(out=tmp_path).validate(make_tasks(True, 1000, 10))
    assert (tmp_path / "results.jsonl").read_text() == '{"kind": "row"}\n'


def test_settings_give_the_lr_sizes_the_run_used(tmp_path: Path) -> None:
    quick = BenchSettings(out=tmp_path, quick=True).to_dict()
    lr = make_tasks(True, 1_000_000, 100)["lr"]
    assert (quick["lr_rows"], quick["lr_features"]) == (lr.synthetic_samples, 100) == (20_000, 100)
    full = BenchSettings(out=tmp_path, lr_rows=5000, lr_features=7).to_dict()
    assert (full["lr_rows"], full["lr_features"]) == (5000, 7)


def _record(task: str, strategy: str | None, repeat: int, samples: float | None) -> dict[str, Any]:
    return {
        "task": task,
        "strategy": strategy,
        "engine": "local" if strategy else "mllib",
        "system": "ember" if strategy else "mllib",
        "repeat": repeat,
        "samples_to_target": samples,
    }


def test_divergence_is_samples_to_target_over_singles_in_the_same_repetition() -> None:
    records = [
        _record("mlp", "single", 0, 1000.0),
        _record("mlp", "single", 1, 2000.0),
        _record("mlp", "async", 0, 1500.0),
        _record("mlp", "async", 1, 3000.0),
        _record("mlp", "bsp", 0, None),  # never reached the target
        _record("mlp", None, 0, 500.0),  # mllib: another optimizer, no d
        _record("lr", "async", 0, 10.0),  # no single row for lr
    ]
    add_divergence(records)
    assert [r["divergence"] for r in records] == [1.0, 1.0, 1.5, 1.5, None, None, None]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "--bandwidth", "fast"], "bandwidth 'fast'"),
        (["plan", "--workers", "4,2"], "increasing counts"),
        (["plan", "--latency", "soon"], "latency 'soon'"),
        (["bench", "--tasks", "resnet"], "unknown task resnet"),
        (["bench", "--taus", "0"], "--taus"),
    ],
)
def test_bad_bench_and_plan_flags_exit_2_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    from ember.cli import main

    extra = ["--out", str(tmp_path / "bench")] if argv[0] == "bench" else []
    assert main([*argv, *extra]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "bench" / "results.jsonl").exists()


def test_epochs_replace_every_tasks_own_and_keep_its_target() -> None:
    own = make_tasks(False, 1000, 10)
    tasks = make_tasks(False, 1000, 10, epochs=3)
    assert {t.epochs for t in tasks.values()} == {3}
    assert {k: t.target_value for k, t in tasks.items()} == {
        k: t.target_value for k, t in own.items()
    }
    assert own["mlp"].epochs == 5


def test_a_runs_figures_keep_each_workers_periods_from_its_first_start(tmp_path: Path) -> None:
    import json

    from ember_lab.bench.record import run_figures

    settings = BenchSettings(out=tmp_path, tasks=["mlp"], strategies=["easgd-async"])
    row = next(r for r in plan_rows(settings, make_tasks(True, 1000, 10)) if r.config)
    assert row.config is not None
    summary = {"test_accuracy": 0.9, "test_loss": 0.3, "samples": 1280, "train_seconds": 1.0,
               "samples_per_second": 1280.0}  # fmt: skip
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    chosen = {"policy": "auto", "reason": "measured", "t_comp": None, "t_comm": None}
    lines = [
        {"kind": "tau", "rank": 0, "incarnation": 7, "step": 0, "tau": 8, "previous": None},
        {"kind": "tau", "rank": 1, "incarnation": 9, "step": 0, "tau": 8, "previous": None},
        {"kind": "tau", "rank": 0, "incarnation": 7, "step": 40, "tau": 32, "previous": 8},
        {"kind": "eval", "epoch": 1, "step": 10, "epoch_end": False, "seconds": 0.5,
         "samples": 640, "test_accuracy": 0.8},
        {"kind": "tau", "rank": 1, "incarnation": 12, "step": 30, "tau": 16, "previous": 8},
    ]  # fmt: skip
    lines = [{**chosen, **line} if line["kind"] == "tau" else line for line in lines]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    figures = run_figures(row, tmp_path, row.config)
    assert figures["tau_choices"] == {"0": [[0, 8], [40, 32]], "1": [[0, 8]]}
    assert figures["curve"][0] == [0.5, 640, 0.8]
    # a fixed period records no choices
    (tmp_path / "metrics.jsonl").write_text(json.dumps(lines[3]) + "\n")
    assert "tau_choices" not in run_figures(row, tmp_path, row.config)


@pytest.mark.parametrize(
    "retried", [{"spark": {"stage_attempts": 2}}, {"worker_restarts": 1}], ids=["spark", "local"]
)
def test_a_run_that_retried_its_training_is_a_failed_row(
    tmp_path: Path, retried: dict[str, Any]
) -> None:
    import json

    from ember_lab.bench.record import run_figures

    settings = BenchSettings(out=tmp_path, tasks=["mlp"], strategies=["easgd-async"])
    row = next(r for r in plan_rows(settings, make_tasks(True, 1000, 10)) if r.config)
    assert row.config is not None
    summary = {"test_accuracy": 0.9, "test_loss": 0.3, "samples": 1280, "train_seconds": 1.0,
               "samples_per_second": 1280.0, "spark": {"stage_attempts": 1}}  # fmt: skip
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "metrics.jsonl").write_text("")
    assert run_figures(row, tmp_path, row.config)["samples"] == 1280
    (tmp_path / "summary.json").write_text(json.dumps({**summary, **retried}))
    with pytest.raises(RuntimeError, match=r"retried its training .* mix attempts"):
        run_figures(row, tmp_path, row.config)


def test_a_diverged_row_reaches_no_target_and_its_results_stay_strict_json(
    tmp_path: Path,
) -> None:
    import json

    from ember_lab.bench.record import append, one_line

    tasks = make_tasks(True, 1000, 10).values()
    loss_task = next(t for t in tasks if t.target_metric == "test_loss")
    assert not loss_task.reached(None)  # summary.json's null for a NaN loss
    assert loss_task.reached(loss_task.target_value)
    record = {
        "status": "ok",
        "target_metric": "test_loss",
        "test_loss": float("nan"),
        "time_to_target": None,
        "samples_per_second": 10.0,
        "wall_seconds": 1.0,
    }
    append(tmp_path / "results.jsonl", record)
    text = (tmp_path / "results.jsonl").read_text()
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c}"))["test_loss"] is None
    assert one_line({**record, "test_loss": None}).startswith("null test_loss, ")
