"""The `ember bench` report: report.md with per-task tables, and PNG plots beside it."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ember_lab.bench.groups import Group, group_records, sweep_rows, target_of, task_title
from ember_lab.bench.plots import plot_bars, plot_curves, plot_sweep

Format = Callable[[float], str]

MISSING = "—"
WITHIN = 0.25
SMOKE_RUN = (
    "**A smoke run** (`ember bench --quick`): every row ran on reduced data, epochs and MLlib "
    "iterations, and the throughput model calibrated on a quarter of the steps, so its figures "
    "show that the rows run and are not comparable to a full run's; "
    "this report draws no headline from them."
)

READING_GUIDE = (
    "Every figure is the median over the repetitions of a row, with the min–max range in brackets "
    "when the repetitions differ; failed repetitions are left out of the figures. Time to target "
    "is training time only (ember's worker loops, MLlib's fit calls) until the target metric was "
    "first met; wall time also includes process start, data loading and evaluation. CPU is a "
    "percentage of all cores, taken over the row's whole process tree, and peak memory is that "
    "tree's largest summed RSS. Bytes/sample counts bytes pushed and pulled per training sample; "
    "divergence d is the samples a row needed to reach the target over single's in the same "
    "repetition. For the curve, ember's worker 0 copies the model eight times an epoch and "
    "evaluates the copies on the whole test set after training (`--eval-deferred`), so no "
    "worker waits for it; rows whose config lacks eval_deferred were measured before that, "
    "evaluating on the spot four times an epoch, and in their synchronous rows (bsp, ssp, "
    "easgd, allreduce) samples/s pays for the other workers' waits. Predicted samples/s comes "
    "from ember_lab.perfmodel, such waits included, followed by its error relative to the "
    "measured median."
)


def _escape(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def _table(header: Sequence[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(_escape(c) for c in row) + " |" for row in rows]


def _thousands(value: float) -> str:
    return f"{value:,.0f}"


def _fixed(places: int) -> Format:
    return lambda value: f"{value:.{places}f}"


def _seconds(value: float) -> str:
    return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"


def _general(value: float) -> str:
    """Three significant figures or so, without scientific notation."""
    if abs(value) >= 100:
        return _thousands(value)
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def _cell(values: list[float], fmt: Format) -> str:
    if not values:
        return MISSING
    median, low, high = fmt(statistics.median(values)), fmt(min(values)), fmt(max(values))
    return median if low == high else f"{median} ({low}–{high})"


def _time_cell(group: Group) -> str:
    reached = group.values("time_to_target")
    if not reached:
        return "not reached"
    cell = _cell(reached, _seconds)
    return (
        cell if len(reached) == len(group.ok) else f"{cell}; {len(reached)}/{len(group.ok)} reached"
    )


def _prediction(group: Group) -> tuple[float, float, float] | None:
    """(predicted, measured, relative error) of the medians, when both exist."""
    predicted, measured = (
        group.median("predicted_samples_per_second"),
        group.median("samples_per_second"),
    )
    if predicted is None or not measured:
        return None
    return predicted, measured, (predicted - measured) / measured


def _prediction_cell(group: Group) -> str:
    predicted = _cell(group.values("predicted_samples_per_second"), _thousands)
    figures = _prediction(group)
    return predicted if figures is None else f"{predicted}, {100 * figures[2]:+.1f}%"


def _label(group: Group) -> str:
    failed = len(group.failed)
    return (
        f"{group.row} ({failed}/{len(group.records)} failed)" if failed and group.ok else group.row
    )


# fmt: off
ROW_HEADER = [
    "row", "engine", "time to target (s)", "final accuracy", "final loss", "samples/s", "s/epoch",
    "CPU mean / peak %", "peak memory MB", "bytes/sample", "T_comp / T_comm (s)", "divergence d",
    "predicted samples/s, error",
]
SWEEP_HEADER = [
    "samples/s", "final accuracy", "final loss", "time to target (s)", "predicted samples/s, error",
]
# fmt: on


def _cells(group: Group) -> dict[str, str]:
    """The table cells of a group by ROW_HEADER's names; a group with no ok repetition has only
    its label, engine and error."""
    cells = {"row": _label(group), "engine": group.engine}
    if not group.ok:
        error = group.failed[0].get("error") or "unknown error"
        return {**cells, "time to target (s)": f"failed: {error}"}
    t_comp, t_comm = group.values("t_comp_seconds"), group.values("t_comm_seconds")
    figures = [
        _time_cell(group),
        _cell(group.values("test_accuracy"), _fixed(4)),
        _cell(group.values("test_loss"), _fixed(4)),
        _cell(group.values("samples_per_second"), _thousands),
        _cell(group.values("seconds_per_epoch"), _seconds),
        f"{_cell(group.values('cpu_mean_percent'), _fixed(0))} / "
        f"{_cell(group.values('cpu_peak_percent'), _fixed(0))}",
        _cell(group.values("peak_memory_mb"), _thousands),
        _cell(group.values("bytes_per_sample"), _general),
        f"{_cell(t_comp, _seconds)} / {_cell(t_comm, _seconds)}" if t_comp or t_comm else MISSING,
        _cell(group.values("divergence"), _fixed(2)),
        _prediction_cell(group),
    ]
    return {**cells, **dict(zip(ROW_HEADER[2:], figures, strict=True))}


def _target_text(metric: str, value: float | None) -> str:
    name = metric.replace("test_", "test ")
    if value is None:
        return name
    return f"{name} {'≥' if metric == 'test_accuracy' else '≤'} {value:g}"


def _short_of_target(groups: list[Group]) -> list[str]:
    """A quick run's word on the rows that never reached the target, with where they ended."""
    metric, value = target_of(groups)
    short = [g for g in groups if g.ok and not g.values("time_to_target")]
    if not short or value is None:
        return []
    ended = [f"{g.row} ({_cell(g.values(metric), _fixed(4))} at the end)" for g in short]
    name = metric.replace("test_", "test ")
    return [f"Did not reach {name} {value:g} in this reduced run: {', '.join(ended)}.", ""]


def _headline(task: str, groups: list[Group]) -> str:
    """The fastest ember row of the task's table against Spark MLlib, by time to target."""
    metric, value = target_of(groups)
    goal = metric.replace("test_", "test ") + ("" if value is None else f" {value:g}")

    def speed(g: Group) -> tuple[float, float]:
        return -len(g.values("time_to_target")) / len(g.ok), g.median("time_to_target") or 0.0

    ember = [g for g in groups if not g.is_mllib and not g.first("sweep")]
    fastest = min((g for g in ember if g.values("time_to_target")), key=speed, default=None)
    ember_time = (fastest.median("time_to_target") if fastest else None) or 0.0
    if not ember:
        text = f"{task}: no ember row outside the tau sweep was run"
    elif fastest is None:
        text = f"{task}: no ember row reached {goal}"
    else:
        reached, runs = len(fastest.values("time_to_target")), len(fastest.ok)
        partly = "" if reached == runs else f" in {reached}/{runs} repetitions"
        text = f"{task}: {fastest.row} reached {goal} in {_seconds(ember_time)} s{partly}"
    mllib = [g for g in groups if g.is_mllib]
    mllib_times = [t for g in mllib if (t := g.median("time_to_target")) is not None]
    if not mllib:
        return f"{text}; Spark MLlib was not run."
    if not any(g.ok for g in mllib):
        return f"{text}; Spark MLlib failed."
    if not mllib_times:
        trained = [s for g in mllib for s in g.values("train_seconds")]
        spent = f" in {_seconds(statistics.median(trained))} s of training" if trained else ""
        return f"{text}; Spark MLlib did not reach the target{spent}."
    mllib_time = min(mllib_times)
    if fastest is None:
        return f"{text}; Spark MLlib reached it in {_seconds(mllib_time)} s."
    if ember_time > mllib_time:
        ratio = f"{ember_time / mllib_time:.1f}x slower"
    else:
        ratio = f"{mllib_time / ember_time:.1f}x faster" if ember_time > 0 else "faster"
    return f"{text}, {ratio} than Spark MLlib ({_seconds(mllib_time)} s)."


def _settings_section(settings: dict[str, Any]) -> list[str]:
    def show(value: Any) -> str:
        if isinstance(value, dict):
            return ", ".join(f"{k}={show(v)}" for k, v in value.items())
        if isinstance(value, list | tuple):
            return ", ".join(show(v) for v in value)
        if value is None:
            return MISSING
        return value if isinstance(value, str) else json.dumps(value)

    lines = ["## Settings", ""]
    return lines + _table(("setting", "value"), [[str(k), show(v)] for k, v in settings.items()])


def _sweep_table(groups: list[Group]) -> list[str]:
    header = ["tau", *(["engine"] if len({g.engine for g in groups}) > 1 else []), *SWEEP_HEADER]
    rows = []
    for g in groups:
        cells = {**_cells(g), "tau": str(g.first("tau") if g.first("tau") is not None else g.row)}
        rows.append([cells.get(name, "") for name in header])
    return _table(header, rows)


def _model_section(tasks: dict[str, list[Group]]) -> list[str]:
    lines = ["## Model vs measurement", ""]
    errors: list[float] = []
    for task, groups in tasks.items():
        rows = [(g, p) for g in groups for p in [_prediction(g)] if p is not None]
        if not rows:
            continue
        lines += [f"### {task}", ""]
        table = [
            [
                _label(g),
                f"{g.engine} at {g.link}" if g.link else g.engine,
                _thousands(p),
                _thousands(m),
                f"{100 * e:+.1f}%",
            ]
            for g, (p, m, e) in rows
        ]
        lines += _table(
            ("row", "engine", "predicted samples/s", "measured samples/s", "error"), table
        )
        lines.append("")
        errors += [e for _, (_, _, e) in rows]
    if not errors:
        return [*lines, "No row carries a prediction.", ""]
    within = sum(abs(e) <= WITHIN for e in errors)
    share = f"{within}/{len(errors)} rows ({100 * within / len(errors):.0f}%)"
    return [*lines, f"{share} are predicted within {100 * WITHIN:.0f}% of the measurement.", ""]


def _wire_section(wire: dict[str, Any]) -> list[str]:
    """Each wire's exchange side by side (cipher_probe.wire_figures), where the run timed them."""
    lines = ["## The wire: plaintext and encrypted", ""]
    if not wire.get("wires"):
        return [*lines, "Not timed: no task was calibrated.", ""]
    lines += [
        f"One push + pull of {wire['task']}'s {wire['floats']:,} floats over the loopback"
        " socket, shared memory off, as an exchange between hosts moves it (medians of the"
        " repetitions; Gbit/s counts both directions' bytes). On one host a run's payloads go"
        " through shared memory and only its headers are encrypted.",
        "",
    ]
    rows = [
        [name, f"{f['gbit']:.2f}", f"{f['vs_plaintext']:.2f}",
         f"{f['client_cpu_ms']:.2f}", f"{f['server_cpu_ms']:.2f}"]
        for name, f in wire["wires"].items()
    ]  # fmt: skip
    head = ("wire", "Gbit/s", "/ plaintext", "client CPU ms", "server CPU ms")
    return [*lines, *_table(head, rows), ""]


def _image(path: Path | None, what: str, missing: str) -> list[str]:
    return [f"![{what}]({path.name})", ""] if path else [f"No {what} plot: {missing}.", ""]


def write_report(records: list[dict[str, Any]], out: Path, settings: dict[str, Any]) -> list[Path]:
    """Write out/report.md and the PNG plots; return the paths written."""
    from ember_lab.bench.linkreport import link_section

    out.mkdir(parents=True, exist_ok=True)
    tasks = group_records([r for r in records if not r.get("link")])
    plots: list[Path] = []

    def keep(path: Path | None, stale: str) -> Path | None:
        # A plot left by an earlier run in the same directory would contradict this report.
        if path is None:
            (out / stale).unlink(missing_ok=True)
        else:
            plots.append(path)
        return path

    reduced = bool(settings.get("quick"))
    lines = ["# ember bench", "", *([SMOKE_RUN, ""] if reduced else []), READING_GUIDE, ""]
    if not tasks:
        lines += ["No rows were recorded.", ""]
    headlines = [] if reduced else [_headline(task, groups) for task, groups in tasks.items()]
    lines += [f"- {h}" for h in headlines] + ([""] if headlines else [])
    for task, groups in tasks.items():
        metric, value = target_of(groups)
        title = task_title(task, groups)
        lines += [f"## {task}: {title} (target {_target_text(metric, value)})", ""]
        main = [[_cells(g).get(h, "") for h in ROW_HEADER] for g in groups if not g.first("sweep")]
        lines += [*(_table(ROW_HEADER, main) if main else ["No rows outside the tau sweep."]), ""]
        if reduced:
            lines += _short_of_target([g for g in groups if not g.first("sweep")])
        curve = keep(plot_curves(task, groups, out), f"curve-{task}.png")
        if curve:
            lines += ["Curves: repetition 0 of each row, or its first successful repetition.", ""]
        lines += _image(curve, f"{task} curve", "no row recorded a training curve")

    lines += ["## Throughput and CPU", ""]
    throughput_keys = [("samples_per_second", "samples/s")]
    cpu_keys = [("cpu_mean_percent", "mean"), ("cpu_peak_percent", "peak")]
    bars = [
        ("throughput", "throughput", throughput_keys, "samples per second", "samples/s"),
        ("cpu", "CPU use", cpu_keys, "% of all cores", "CPU use"),
    ]
    for name, title, keys, unit, measured in bars:
        plot = plot_bars(tasks, out / f"{name}.png", f"{title} (median, min–max)", keys, unit)
        lines += _image(keep(plot, f"{name}.png"), title, f"no row measured its {measured}")

    lines += ["## Tau sweep (easgd-async)", ""]
    swept = {task: sweep for task, groups in tasks.items() if (sweep := sweep_rows(groups))}
    for task, groups in swept.items():
        lines += [f"### {task}", "", *_sweep_table(groups), ""]
        lines += _short_of_target(groups) if reduced else []
    sweep_plot = keep(plot_sweep(tasks, out), "tau-sweep.png")
    if not swept:
        lines += ["No tau sweep was run, so there is no tau-sweep plot.", ""]
    else:
        lines += _image(sweep_plot, "tau sweep", "no sweep row with a positive tau succeeded")

    lines += link_section(records, settings, out, keep, _cells, _table)
    lines += _wire_section(settings.get("wire_run") or {})
    lines += _model_section(group_records(records))
    failures = [r for groups in tasks.values() for g in groups for r in g.failed]
    lines += ["## Failures", ""]
    lines += [
        f"- {r.get('task')} / {r.get('row')} ({r.get('engine')}), repetition {r.get('repeat')}: "
        f"{_escape(r.get('error') or 'unknown error')}"
        for r in failures
    ] or ["None."]
    lines += ["", *_settings_section(settings), ""]

    report = out / "report.md"
    report.write_text("\n".join(lines), encoding="utf-8")
    return [report, *plots]
