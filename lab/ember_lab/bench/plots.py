"""The PNG plots of the `ember bench` report: curves, throughput and CPU bars, the tau sweep."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ember_lab.bench.groups import Group, sweep_rows, target_of

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

DPI = 120


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    return path


def _curve(group: Group) -> list[tuple[float, float]]:
    """Repetition 0's curve, or else the first ok repetition's that has one."""
    candidates = sorted(group.ok, key=lambda r: r.get("repeat") != 0)
    for record in candidates:
        points = [
            (float(p[0]), float(p[2])) for p in record.get("curve") or [] if None not in p[:3]
        ]
        if points:
            return points
    return []


def plot_curves(task: str, groups: list[Group], out: Path) -> Path | None:
    from matplotlib.figure import Figure

    curves = [(g, c) for g in groups if not g.first("sweep") for c in [_curve(g)] if c]
    if not curves:
        return None
    metric, value = target_of(groups)
    fig = Figure(figsize=(8, 5))
    ax = fig.add_subplot()
    for group, points in curves:
        label = group.row if group.engine in ("local", "mllib") else f"{group.row} ({group.engine})"
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=label)
    if value is not None:
        ax.axhline(value, color="black", linestyle="--", linewidth=1, label=f"target {value:g}")
    times = [p[0] for _, points in curves for p in points if p[0] > 0]
    # MLlib's fits can take a hundred times ember's rows: a log axis keeps the fast rows apart
    spread = bool(times) and max(times) > 20 * min(times)
    if spread:
        ax.set_xscale("log")
    ax.set(
        title=f"{task}: {metric.replace('_', ' ')} during training",
        xlabel="training time (s, log scale)" if spread else "training time (s)",
        ylabel=metric.replace("_", " "),
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, out / f"curve-{task}.png")


def plot_bars(
    tasks: dict[str, list[Group]],
    path: Path,
    title: str,
    keys: Sequence[tuple[str, str]],
    unit: str,
) -> Path | None:
    """Horizontal bars of the medians of `keys` per non-sweep row, one subplot per task."""
    from matplotlib.figure import Figure

    panels = {
        task: [g for g in groups if not g.first("sweep") and g.median(keys[0][0]) is not None]
        for task, groups in tasks.items()
    }
    panels = {task: groups for task, groups in panels.items() if groups}
    if not panels:
        return None
    tallest = max(len(groups) for groups in panels.values())
    fig = Figure(figsize=(6.5 * len(panels), 1.5 + 0.45 * tallest * len(keys)))
    for index, (task, groups) in enumerate(panels.items()):
        ax = fig.add_subplot(1, len(panels), index + 1)
        height = 0.8 / len(keys)
        for k, (key, legend) in enumerate(keys):
            positions = [i + (k - (len(keys) - 1) / 2) * height for i in range(len(groups))]
            medians = [g.median(key) or 0.0 for g in groups]
            spread = [
                [m - min(g.values(key) or [m]) for g, m in zip(groups, medians, strict=True)],
                [max(g.values(key) or [m]) - m for g, m in zip(groups, medians, strict=True)],
            ]
            ax.barh(positions, medians, height=height, xerr=spread, capsize=3, label=legend)
        positive = [v for g in groups for v in [g.median(keys[0][0])] if v and v > 0]
        if positive and max(positive) / min(positive) > 100:
            ax.set_xscale("log")
        ax.set_yticks(range(len(groups)), [g.row for g in groups])
        ax.invert_yaxis()
        ax.set(title=f"{task}: {title}", xlabel=unit)
        ax.grid(axis="x", alpha=0.3)
        if len(keys) > 1:
            ax.legend(fontsize="small")
    return _save(fig, path)


def plot_sweep(tasks: dict[str, list[Group]], out: Path) -> Path | None:
    from matplotlib.figure import Figure

    panels = {}
    for task, groups in tasks.items():
        points = [g for g in sweep_rows(groups) if (g.first("tau") or 0) > 0 and g.ok]
        if points:
            panels[task] = points
    if not panels:
        return None
    fig = Figure(figsize=(7 * len(panels), 4.5))
    for index, (task, groups) in enumerate(panels.items()):
        ax = fig.add_subplot(1, len(panels), index + 1)
        taus = [float(g.first("tau")) for g in groups]
        metric, _ = target_of(groups)
        quality = "test_accuracy" if metric == "test_accuracy" else "test_loss"
        twin = ax.twinx()
        series = [
            (ax, "samples_per_second", "o-", "tab:blue", "measured samples/s"),
            (ax, "predicted_samples_per_second", "s--", "tab:cyan", "predicted samples/s"),
            (twin, quality, "^-", "tab:orange", f"final {quality.replace('_', ' ')}"),
        ]
        lines: list[Line2D] = []
        for axes, key, style, color, label in series:
            values = [g.median(key) for g in groups]
            if any(v is not None for v in values):
                ys = [float("nan") if v is None else v for v in values]
                lines += axes.plot(taus, ys, style, color=color, label=label)
        _tau_axis(ax, taus, f"{task}: easgd-async tau sweep", "samples/s")
        twin.set_ylabel(quality.replace("_", " "))
        ax.grid(alpha=0.3)
        ax.legend(lines, [str(line.get_label()) for line in lines], fontsize="small")
    return _save(fig, out / "tau-sweep.png")


def plot_speedup(panels: dict[str, list[dict[str, float | None]]], path: Path, link: str) -> Path:
    """Speedup against tau per task: measured and predicted samples/s, time to target, n / d."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7 * len(panels), 4.5))
    series = [
        ("measured", "o-", "tab:blue", "samples/s, measured"),
        ("predicted", "s--", "tab:cyan", "samples/s, predicted"),
        ("time", "^-", "tab:orange", "time to target, measured"),
        ("bound", ":", "black", "n / d"),
    ]
    for index, (task, points) in enumerate(panels.items()):
        ax = fig.add_subplot(1, len(panels), index + 1)
        taus = [float(p["tau"] or 0) for p in points]
        for key, style, color, label in series:
            values = [p[key] for p in points]
            if any(v is not None for v in values):
                ys = [float("nan") if v is None else v for v in values]
                ax.plot(taus, ys, style, color=color, label=label)
        _tau_axis(ax, taus, f"{task}: easgd-async speedup over single at {link}", "speedup (x)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return _save(fig, path)


def _tau_axis(ax: Any, taus: list[float], title: str, ylabel: str) -> None:
    """A tau sweep's x axis: powers of two, each tau of the sweep a tick."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(taus, [f"{tau:g}" for tau in taus])
    ax.minorticks_off()
    ax.set(title=title, xlabel="tau (steps between exchanges)", ylabel=ylabel)
