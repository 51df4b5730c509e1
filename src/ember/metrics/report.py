"""A picture of one run, `report.png` beside its summary: the workers' training loss against
time, worker 0's held-out figures against epoch (and the final model's), and the learning
rate against step. Drawn from the run's own files, so `ember report RUN` draws any run again;
matplotlib is an optional extra (ember[report])."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from ember.errors import ConfigError
from ember.metrics.records import Evaluation, Record, WorkerProgress

REPORT = "report.png"


def draw_report(run_dir: str | Path) -> Path:
    """Draw `run_dir`'s report.png from its metrics.jsonl and summary.json; returns its path."""
    from ember.metrics import headline, read_records

    run_dir = Path(run_dir).expanduser()
    if not (run_dir / "metrics.jsonl").is_file():
        raise ConfigError(f"{run_dir}: not a run directory (no metrics.jsonl)")
    try:
        import matplotlib

        matplotlib.use("Agg")  # a file, never a window
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("a run's report needs matplotlib: pip install 'ember[report]'") from None
    records = read_records(run_dir / "metrics.jsonl")
    summary_file = run_dir / "summary.json"
    summary: dict[str, Any] = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    figure, (losses, scores, rates) = plt.subplots(1, 3, figsize=(13, 3.6), layout="constrained")
    _losses(losses, records)
    _scores(scores, records, summary, headline)
    _rates(rates, records)
    said = [str(summary.get(key, "?")) for key in ("strategy", "model", "data")]
    figure.suptitle(f"{said[0]}, {said[1]} on {said[2]}: {run_dir.name}")
    figure.savefig(run_dir / REPORT, dpi=90)
    plt.close(figure)
    return run_dir / REPORT


def _progress(records: list[Record]) -> dict[int, list[WorkerProgress]]:
    by_rank: dict[int, list[WorkerProgress]] = defaultdict(list)
    for record in records:
        if isinstance(record, WorkerProgress):
            by_rank[record.rank].append(record)
    return by_rank


def _losses(axes: Any, records: list[Record]) -> None:
    for rank, progress in sorted(_progress(records).items()):
        timed = [(r.seconds, r.loss) for r in progress if r.seconds is not None]
        if timed:
            axes.plot(*zip(*timed, strict=True), label=f"worker {rank}", linewidth=1)
    axes.set(xlabel="training seconds", ylabel="training loss", title="loss")
    axes.legend(fontsize="small")


def _scores(axes: Any, records: list[Record], summary: dict[str, Any], headline: Any) -> None:
    ends = [r for r in records if isinstance(r, Evaluation) and r.epoch_end]
    if ends:
        name = headline(ends[-1].scores)[0]
        points = [(r.epoch, headline(r.scores)[1]) for r in ends]
        axes.plot(*zip(*points, strict=True), marker="o", label=f"worker 0: test {name}")
        final = summary.get(f"test_{name}")
        if isinstance(final, (int, float)):
            axes.scatter([points[-1][0]], [final], marker="*", s=120, color="C3", zorder=3,
                         label=f"final model: {final:.4f}")  # fmt: skip
        axes.set_ylabel(f"test {name}")
        axes.legend(fontsize="small")
    axes.set(xlabel="epoch", title="held-out figure")


def _rates(axes: Any, records: list[Record]) -> None:
    progress = _progress(records).get(0, [])
    rated = [(r.step, r.lr) for r in progress if r.lr is not None]
    if rated:
        axes.plot(*zip(*rated, strict=True), linewidth=1)
    axes.set(xlabel="step (worker 0)", ylabel="learning rate", title="learning rate")
