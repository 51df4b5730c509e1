"""`ember bench`'s report: report.md's tables, headlines and sections, and the PNG plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ember_lab.bench.report import write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SETTINGS = {"quick": False, "repeat": 3, "tasks": ["lr", "mlp"], "machine": {"cpus": 2}}
TARGETS = {"mlp": ("test_accuracy", 0.9), "lr": ("test_loss", 0.4)}
# (data, training samples, test samples, features, epochs, MLlib iterations) of a full run
DATA = {
    "mlp": ("mnist", 60_000, 10_000, 784, 5, 40),
    "lr": ("synthetic-lr", 10**6, 10**5, 100, 2, 20),
}
# fmt: off
FIGURES = [
    "time_to_target", "samples_to_target", "test_accuracy", "test_loss", "samples",
    "train_seconds", "samples_per_second", "seconds_per_epoch", "cpu_mean_percent",
    "cpu_peak_percent", "peak_memory_mb", "bytes_per_sample", "t_comp_seconds", "t_comm_seconds",
    "curve", "divergence",
]
# fmt: on


def record(task: str, row: str, repeat: int, **fields: Any) -> dict[str, Any]:
    """A successful row with plausible figures; `fields` overrides any of them."""
    metric, target = TARGETS[task]
    data, train, test, features, epochs, iterations = DATA[task]
    mllib = row == "mllib"
    time_to_target = fields.get("time_to_target", 5.0)
    end = 10.0
    good = target + 0.02 if metric == "test_accuracy" else target - 0.05
    curve = [[0.0, 0, 0.5], [time_to_target or end / 2, 1000, good], [end, 2000, good]]
    base: dict[str, Any] = {
        "kind": "row",
        "task": task,
        "row": row,
        "system": "mllib" if mllib else "ember",
        "strategy": None if mllib else row.split()[0],
        "engine": "mllib" if mllib else "local",
        "workers": 2,
        "tau": None,
        "sweep": False,
        "repeat": repeat,
        "status": "ok",
        "error": None,
        "target_metric": metric,
        "target_value": target,
        "data": data,
        "train_samples": train,
        "test_samples": test,
        "features": features,
        "epochs": None if mllib else epochs,
        "iterations": iterations if mllib else None,
        "time_to_target": time_to_target,
        "samples_to_target": 1000,
        "test_accuracy": 0.92,
        "test_loss": 0.3,
        "samples": 2000,
        "train_seconds": end,
        "wall_seconds": end + 3,
        "samples_per_second": 200.0,
        "seconds_per_epoch": 2.5,
        "cpu_mean_percent": 60.0,
        "cpu_peak_percent": 95.0,
        "peak_memory_mb": 900.0,
        "bytes_per_sample": None if mllib else 512.0,
        "t_comp_seconds": None if mllib else 8.0,
        "t_comm_seconds": None if mllib else 2.0,
        "curve": curve,
        "divergence": None if mllib else 1.0,
        "predicted_samples_per_second": None,
        "prediction_error": None,
        "config": {},
        "ember_version": "0.1.0",
    }
    base.update(fields)
    return base


def failed(task: str, row: str, repeat: int, error: str) -> dict[str, Any]:
    nothing = dict.fromkeys(FIGURES)
    return record(task, row, repeat, status="failed", error=error, **nothing)


def sweep(task: str, tau: int, repeat: int, **fields: Any) -> dict[str, Any]:
    return record(
        task,
        f"easgd-async tau={tau}",
        repeat,
        strategy="easgd-async",
        tau=tau,
        sweep=True,
        samples_per_second=100.0 * tau,
        predicted_samples_per_second=110.0 * tau,
        **fields,
    )


def records(with_sweep: bool = True) -> list[dict[str, Any]]:
    rows = []
    for repeat in range(3):
        rows += [
            record("mlp", "mllib", repeat, time_to_target=[50.0, 52.0, 48.0][repeat]),
            record(
                "mlp",
                "bsp",
                repeat,
                time_to_target=[10.0, 12.0, 11.0][repeat],
                samples_per_second=[100.0, 200.0, 900.0][repeat],
                predicted_samples_per_second=250.0,
            ),
            failed("mlp", "allreduce", repeat, "RuntimeError: gloo | rank 1 hung up"),
            record("lr", "mllib", repeat, time_to_target=None, train_seconds=30.0),
            record("lr", "single", repeat, time_to_target=4.0, samples_per_second=1_234_567.0),
            record("lr", "my-new-strategy", repeat, strategy="my-new-strategy", curve=None),
        ]
        if repeat == 1:
            rows.append(failed("mlp", "async", repeat, "worker 2 exited with code 1"))
        else:
            rows.append(record("mlp", "async", repeat, time_to_target=[7.0, None, None][repeat]))
        if with_sweep:
            rows += [sweep("mlp", tau, repeat) for tau in (1, 4, 16)]
    rows.append(failed("mlp", "easgd-async tau=64", 0, "sweep point broke") | {"sweep": True})
    rows[-1]["tau"] = 64
    # Out of order on purpose: the report must not depend on the order of results.jsonl.
    return rows[::-1]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[Path]]:
    out = tmp_path_factory.mktemp("bench")
    paths = write_report(records(), out, SETTINGS)
    return (out / "report.md").read_text(encoding="utf-8"), paths


def table_line(text: str, section: str, row: str) -> str:
    """The table line of `row` in the section whose heading starts with `section`."""
    part = text.split(f"\n## {section}", 1)[1].split("\n## ", 1)[0]
    return next(line for line in part.splitlines() if line.startswith(f"| {row} "))


def test_report_lists_every_row_in_strategy_order(report: tuple[str, list[Path]]) -> None:
    text, _ = report
    for task, rows in {
        "mlp": ["mllib", "bsp", "async (1/3 failed)", "allreduce"],
        "lr": ["mllib", "single", "my-new-strategy"],
    }.items():
        part = text.split(f"\n## {task}:", 1)[1].split("\n## ", 1)[0]
        positions = [part.index(f"| {row} |") for row in rows]
        assert positions == sorted(positions), (task, positions)


def test_cells_show_the_median_and_the_range_of_the_repetitions(
    report: tuple[str, list[Path]],
) -> None:
    text, _ = report
    bsp = table_line(text, "mlp", "bsp")
    assert "| 200 (100–900) |" in bsp
    assert "| 11.0 (10.0–12.0) |" in bsp
    assert "| 0.9200 |" in bsp  # equal repetitions show no range
    assert "250, +25.0%" in bsp
    assert "1,234,567" in table_line(text, "lr", "single")
    assert "| — |" in table_line(text, "mlp", "mllib")  # no bytes/sample for MLlib


def test_time_to_target_says_when_it_was_not_or_only_partly_reached(
    report: tuple[str, list[Path]],
) -> None:
    text, _ = report
    assert "| not reached |" in table_line(text, "lr", "mllib")
    # async: repetition 1 failed, 0 reached in 7 s, 2 never did.
    assert "| 7.00; 1/2 reached |" in table_line(text, "mlp", "async (1/3 failed)")


def test_failures_show_in_the_table_and_in_the_failures_list(
    report: tuple[str, list[Path]],
) -> None:
    text, _ = report
    assert "failed: RuntimeError: gloo \\| rank 1 hung up" in table_line(text, "mlp", "allreduce")
    failures = text.split("\n## Failures", 1)[1].split("\n## ", 1)[0]
    assert "- mlp / async (local), repetition 1: worker 2 exited with code 1" in failures
    assert failures.count("RuntimeError: gloo") == 3
    assert "sweep point broke" in failures


def test_headlines_compare_the_fastest_ember_row_with_mllib(
    report: tuple[str, list[Path]],
) -> None:
    text, _ = report
    # async reached in 1/2 repetitions only, so bsp's 11 s against MLlib's 50 s leads.
    mlp = "- mlp: bsp reached test accuracy 0.9 in 11.0 s, 4.5x faster than Spark MLlib (50.0 s)."
    lr = "- lr: single reached test loss 0.4 in 4.00 s; Spark MLlib did not reach the target in "
    assert mlp in text
    assert f"{lr}30.0 s of training." in text


def test_a_full_report_names_its_data_and_sizes_and_draws_its_headlines(
    report: tuple[str, list[Path]],
) -> None:
    text, _ = report
    assert (
        "\n## mlp: multilayer perceptron on mnist, 60,000 training and 10,000 test samples of 784"
        " features, 5 epochs, MLlib 40 iterations (target test accuracy ≥ 0.9)\n" in text
    )
    assert "\n## lr: binary logistic regression on synthetic-lr, 1,000,000 training" in text
    assert "faster than Spark MLlib" in text
    assert "smoke run" not in text and "reduced run" not in text


def quick_records() -> list[dict[str, Any]]:
    """One repetition of a quick run: digits and 20,000 lr rows, 1 epoch, 4 MLlib iterations."""
    sizes = {"mlp": ("digits", 10_000, 2_000, 784), "lr": ("synthetic-lr", 20_000, 1_000, 100)}
    rows = [
        record("mlp", "mllib", 0, time_to_target=None, test_accuracy=0.14, iterations=4),
        record("mlp", "bsp", 0, time_to_target=3.0, epochs=1),
        record("mlp", "easgd-async", 0, time_to_target=1.0, epochs=1),
        record("lr", "mllib", 0, time_to_target=4.0, iterations=5),
        record("lr", "single", 0, time_to_target=None, test_loss=0.52, epochs=1),
    ]
    for row in rows:
        data, train, test, features = sizes[row["task"]]
        row.update(data=data, train_samples=train, test_samples=test, features=features)
    return rows


def test_a_quick_report_says_it_is_a_smoke_run_of_what_it_ran_and_claims_nothing(
    tmp_path: Path,
) -> None:
    settings = {"quick": True, "repeat": 1, "lr_rows": 20_000, "lr_features": 100}
    write_report(quick_records(), tmp_path, settings)
    text = (tmp_path / "report.md").read_text(encoding="utf-8")
    top = text.split("\n## ", 1)[0]
    assert "A smoke run" in top and "not comparable to a full run" in top
    assert (
        "\n## mlp: multilayer perceptron on digits, 10,000 training and 2,000 test samples of 784"
        " features, 1 epoch, MLlib 4 iterations (target test accuracy ≥ 0.9)\n" in text
    )
    assert (
        "\n## lr: binary logistic regression on synthetic-lr, 20,000 training and 1,000 test"
        " samples of 100 features, 1 epoch, MLlib 5 iterations (target test loss ≤ 0.4)\n" in text
    )
    assert "mnist" not in text.lower()
    assert "faster than" not in text and "slower than" not in text
    assert not [line for line in top.splitlines() if line.startswith("- ")]  # no headlines
    mlp = text.split("\n## mlp:", 1)[1].split("\n## ", 1)[0]
    word = "Did not reach test accuracy 0.9 in this reduced run: mllib (0.1400 at the end)."
    assert word in mlp
    assert "Did not reach test loss 0.4 in this reduced run: single (0.5200 at the end)." in text
    assert "| lr_rows | 20000 |" in text


def test_headline_says_when_mllib_was_not_run(tmp_path: Path) -> None:
    write_report([record("mlp", "bsp", 0, time_to_target=20.0)], tmp_path, {})
    assert "Spark MLlib was not run" in (tmp_path / "report.md").read_text(encoding="utf-8")


def test_tau_sweep_table_has_a_line_per_tau(report: tuple[str, list[Path]]) -> None:
    text, _ = report
    section = text.split("\n## Tau sweep", 1)[1].split("\n## ", 1)[0]
    assert "| tau | samples/s | final accuracy | final loss | time to target (s) |" in section
    assert "| 4 | 400 | 0.9200 | 0.3000 | 5.00 | 440, +10.0% |" in section
    assert "| 64 |  |  |  | failed: sweep point broke |  |" in section
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    assert [line.split("|")[1].strip() for line in lines[1:]] == ["1", "4", "16", "64"]
    assert "![tau sweep](tau-sweep.png)" in section
    assert "tau=" not in table_line(text, "mlp", "bsp")
    assert "| easgd-async tau=4 |" not in text.split("\n## mlp:", 1)[1].split("\n## ", 1)[0]


def test_model_vs_measurement_counts_rows_within_a_quarter(
    report: tuple[str, list[Path]],
) -> None:
    text, _ = report
    section = text.split("\n## Model vs measurement", 1)[1].split("\n## ", 1)[0]
    assert "| bsp | local | 250 | 200 | +25.0% |" in section
    assert "| easgd-async tau=16 | local | 1,760 | 1,600 | +10.0% |" in section
    assert "4/4 rows (100%) are predicted within 25%" in section


def test_settings_are_printed(report: tuple[str, list[Path]]) -> None:
    text, _ = report
    assert "| repeat | 3 |" in text
    assert "| tasks | lr, mlp |" in text
    assert "| machine | cpus=2 |" in text


def test_plots_are_real_pngs_linked_from_the_report(report: tuple[str, list[Path]]) -> None:
    text, paths = report
    names = {"report.md", "curve-lr.png", "curve-mlp.png", "throughput.png", "cpu.png"}
    assert {p.name for p in paths} == names | {"tau-sweep.png"}
    for path in paths:
        assert path.parent == paths[0].parent and path.is_file()
        if path.suffix == ".png":
            data = path.read_bytes()
            assert data.startswith(PNG_MAGIC) and len(data) > 10_000, path.name
            assert f"]({path.name})" in text


def test_without_sweep_rows_there_is_no_tau_sweep_plot(tmp_path: Path) -> None:
    write_report(records(), tmp_path, SETTINGS)
    assert (tmp_path / "tau-sweep.png").is_file()
    plain = [r for r in records(with_sweep=False) if not r["sweep"]]
    paths = write_report(plain, tmp_path, SETTINGS)
    text = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert not (tmp_path / "tau-sweep.png").exists()
    assert "tau-sweep.png" not in {p.name for p in paths}
    assert "No tau sweep was run" in text and "](tau-sweep.png)" not in text


def test_no_records_give_a_report_and_no_plots(tmp_path: Path) -> None:
    assert write_report([], tmp_path / "out", {"quick": False}) == [tmp_path / "out" / "report.md"]
    text = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert "No rows were recorded" in text and "No tau sweep was run" in text
    assert "smoke run" not in text
    assert not list((tmp_path / "out").glob("*.png"))


def test_the_wire_section_puts_each_cipher_beside_plaintext(tmp_path: Path) -> None:
    wires = {
        "plaintext": {"gbit": 8.0, "vs_plaintext": 1.0, "client_cpu_ms": 0.5, "server_cpu_ms": 0.4},
        "curve": {"gbit": 4.0, "vs_plaintext": 0.5, "client_cpu_ms": 1.5, "server_cpu_ms": 1.2},
        "aead": {"gbit": 6.0, "vs_plaintext": 0.75, "client_cpu_ms": 0.9, "server_cpu_ms": 0.8},
    }
    wire = {"task": "mlp", "floats": 269_322, "wires": wires}
    write_report(records(), tmp_path, {**SETTINGS, "wire_run": wire})
    text = (tmp_path / "report.md").read_text()
    section = text.split("## The wire: plaintext and encrypted")[1].split("\n## ")[0]
    assert "mlp's 269,322 floats" in section
    assert "| plaintext | 8.00 | 1.00 | 0.50 | 0.40 |" in section
    assert "| curve | 4.00 | 0.50 | 1.50 | 1.20 |" in section
    assert "| aead | 6.00 | 0.75 | 0.90 | 0.80 |" in section
    write_report(records(), tmp_path, SETTINGS)
    assert "Not timed: no task was calibrated." in (tmp_path / "report.md").read_text()
