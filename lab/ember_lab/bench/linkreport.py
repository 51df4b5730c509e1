"""The report's section on emulated links: per link rate a table and plots of its rows, and on
the slowest link the easgd-async speedup against tau, measured beside predicted, with n / d."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ember_lab.bench.groups import Group, group_records, sweep_rows

Record = dict[str, Any]
LATENCY = "link_latency_seconds"
Keep = Callable[[Path | None, str], Path | None]

LINK_HEADER = [
    "row", "time to target (s)", "final accuracy", "samples/s", "bytes/sample",
    "T_comp / T_comm (s)", "divergence d", "predicted samples/s, error",
    "predicted time to target (s), error",
]  # fmt: skip
TIME_PREDICTED = LINK_HEADER[-1]
SPEEDUP_NOTE = (
    "Speedup is against `single` (one worker) at the same link, else on this host: samples/s "
    "over single's, measured and as the model predicts it, and time to target over single's; "
    "n / d is DeepSpark's bound on the time-to-target speedup of n workers whose divergence "
    "penalty is d (the samples they need over single's)."
)


def link_order(records: list[Record], settings: dict[str, Any]) -> list[str]:
    """The links that have rows, in the order they were asked for."""
    seen = [str(r["link"]) for r in records if r.get("link")]
    asked = [link for link in settings.get("links") or [] if link in seen]
    return asked + [link for link in dict.fromkeys(seen) if link not in asked]


def measured_rate(
    records: list[Record], link: str, key: str = "link_bytes_per_second"
) -> float | None:
    """The median of what the link's rows carry under `key`: its rate, or its latency."""
    rates = [float(r[key]) for r in records if r.get("link") == link and r.get(key)]
    return statistics.median(rates) if rates else None


def time_prediction_cell(group: Group) -> str:
    """Predicted time to target (d times single's samples, at the predicted samples/s) and
    its error against the measured time, of the medians."""
    predicted, measured = group.median("predicted_time_to_target"), group.median("time_to_target")
    if predicted is None:
        return "—"
    return f"{predicted:,.1f}" + (f", {100 * (predicted / measured - 1):+.1f}%" if measured else "")


def slowest(records: list[Record], links: list[str]) -> str | None:
    rated = {link: measured_rate(records, link) or math.inf for link in links}
    return min(rated, key=lambda link: rated[link]) if rated else None


def speedups(groups: list[Group], baseline: float | None) -> list[dict[str, float | None]]:
    """Per sweep tau: measured and predicted samples/s speedup, time-to-target speedup and
    n / d, against a single worker's samples/s and time to target."""
    single = next((g for g in groups if g.first("strategy") == "single" and g.ok), None)
    rate = (single.median("samples_per_second") if single else None) or baseline
    single_time = single.median("time_to_target") if single else None
    points = []
    for group in sweep_rows(groups):
        tau, measured = group.first("tau"), group.median("samples_per_second")
        if not tau or measured is None or not rate:
            continue
        predicted = group.median("predicted_samples_per_second")
        time, d = group.median("time_to_target"), group.median("divergence")
        points.append(
            {
                "tau": float(tau),
                "measured": measured / rate,
                "predicted": predicted / rate if predicted else None,
                "time": single_time / time if single_time and time else None,
                "bound": group.first("workers") / d if d else None,
            }
        )
    return points


def link_section(
    records: list[Record],
    settings: dict[str, Any],
    out: Path,
    keep: Keep,
    cells: Callable[[Group], dict[str, str]],
    table: Callable[[list[str], list[list[str]]], list[str]],
) -> list[str]:
    """The markdown of the section; plots are written through `keep`."""
    from ember_lab.bench.plots import plot_bars, plot_curves, plot_speedup

    lines = ["## On emulated links", ""]
    cells = _with_time_prediction(cells)
    skipped = (settings.get("links_run") or {}).get("skipped")
    links = link_order(records, settings)
    if not links:
        reason = skipped or "no link rows were recorded"
        return [*lines, f"Link rows were not run: {reason}.", ""]
    local = group_records([r for r in records if not r.get("link")])
    for link in links:
        rate, latency = measured_rate(records, link), measured_rate(records, link, LATENCY)
        shown = "not measured" if rate is None else f"{8 * rate / 1e6:,.0f} Mbit/s"
        shown += f", {latency * 1e3:.2f} ms one way measured" if latency else " measured"
        hosts = next((r.get("hosts") for r in records if r.get("link") == link), None)
        lines += [f"### {link} ({shown}; {hosts} worker hosts of one core)", ""]
        tasks = group_records([r for r in records if r.get("link") == link])
        name = link.replace(".", "_")
        for task, groups in tasks.items():
            main = [g for g in groups if not g.first("sweep")]
            lines += [f"#### {task}", ""]
            lines += table(LINK_HEADER, [[cells(g).get(h, "") for h in LINK_HEADER] for g in main])
            lines += ["", *_sweep_lines(groups, cells, table)]
            curve = keep(plot_curves(f"{task}-{name}", groups, out), f"curve-{task}-{name}.png")
            lines += [f"![{task} at {link}]({curve.name})", ""] if curve else []
        bars = out / f"throughput-{name}.png"
        title = f"samples/s at {link} (median, min–max)"
        plot = keep(plot_bars(tasks, bars, title, [("samples_per_second", "samples/s")],
                              "samples per second"), bars.name)  # fmt: skip
        lines += [f"![throughput at {link}]({plot.name})", ""] if plot else []
    lines += _speedup_lines(records, links, local, out, keep, plot_speedup)
    return lines


def _with_time_prediction(
    cells: Callable[[Group], dict[str, str]],
) -> Callable[[Group], dict[str, str]]:
    def both(group: Group) -> dict[str, str]:
        made = cells(group)
        return {**made, TIME_PREDICTED: time_prediction_cell(group)} if group.ok else made

    return both


def _sweep_lines(groups: list[Group], cells: Any, table: Any) -> list[str]:
    sweep = sweep_rows(groups)
    if not sweep:
        return []
    header = ["tau", "time to target (s)", "samples/s", "final accuracy", "bytes/sample",
              "predicted samples/s, error", TIME_PREDICTED]  # fmt: skip
    rows = [[str(g.first("tau")), *[cells(g).get(h, "") for h in header[1:]]] for g in sweep]
    return ["easgd-async tau sweep:", "", *table(header, rows), ""]


def _speedup_lines(
    records: list[Record],
    links: list[str],
    local: dict[str, list[Group]],
    out: Path,
    keep: Keep,
    plot: Any,
) -> list[str]:
    link = slowest(records, links)
    if link is None:
        return []
    tasks = group_records([r for r in records if r.get("link") == link])
    panels = {}
    for task, groups in tasks.items():
        base = next((g for g in local.get(task, []) if g.first("strategy") == "single"), None)
        points = speedups(groups, base.median("samples_per_second") if base else None)
        if points:
            panels[task] = points
    lines = [f"### Speedup against tau at {link}, the slowest link", "", SPEEDUP_NOTE, ""]
    if not panels:
        return [*lines, "No sweep row with a single-worker baseline to compare against.", ""]
    header = ["task", "tau", "speedup measured", "predicted", "time-to-target speedup", "n / d"]
    rows = [
        [task, f"{p['tau']:g}", *[_x(p[k]) for k in ("measured", "predicted", "time", "bound")]]
        for task, points in panels.items()
        for p in points
    ]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    name = f"speedup-{link.replace('.', '_')}.png"
    path = keep(plot(panels, out / name, link), name)
    return [*lines, "", *([f"![speedup against tau at {link}]({path.name})", ""] if path else [])]


def _x(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}x"
