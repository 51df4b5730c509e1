"""Run records: metrics.jsonl (and optional TensorBoard scalars) and the summary of a run.

Leaf module: imports nothing from ember.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, TextIO

SCALARS = (
    "loss",
    "samples_per_second",
    "t_comp",
    "t_comm",
    "t_wait",
    "staleness_max",
    "test_accuracy",
    "test_loss",
)


class MetricsLog:
    """Appends one JSON object per line and flushes, so a killed run keeps what it logged."""

    def __init__(self, path: Path, tensorboard: bool = False) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file: TextIO = path.open("a", encoding="utf-8")
        self._started = time.time()
        self._writer: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:  # the tensorboard package is an optional extra
                raise ImportError(
                    "--tensorboard needs the tensorboard package: pip install 'ember[tensorboard]'"
                ) from exc
            self._writer = SummaryWriter(log_dir=str(path.parent / "tensorboard"))

    def write(self, record: dict[str, Any]) -> None:
        record = {"time": round(time.time() - self._started, 4), **record}
        self._file.write(json.dumps(record, default=_jsonable) + "\n")
        self._file.flush()
        if self._writer is not None:
            tag = f"{record.get('kind', 'run')}/{record.get('rank', 'all')}"
            step = int(record.get("step", record.get("epoch", 0)))
            for key in SCALARS:
                if isinstance(record.get(key), (int, float)):
                    self._writer.add_scalar(f"{tag}/{key}", record[key], step)

    def close(self) -> None:
        self._file.close()
        if self._writer is not None:
            self._writer.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarize_workers(results: list[dict[str, Any]], wall_seconds: float) -> dict[str, Any]:
    """Totals over the workers' final records. Throughput counts every worker's samples over the
    longest worker's training loop; wall_seconds adds process start-up and data loading."""
    total = lambda key: sum(r.get(key, 0) for r in results)  # noqa: E731
    t_comm, t_wait = total("t_comm"), total("t_wait")
    seconds = max((r.get("seconds", 0.0) for r in results), default=0.0)
    return {
        "train_seconds": seconds,
        "wall_seconds": wall_seconds,
        "samples": total("samples"),
        "samples_per_second": total("samples") / seconds if seconds > 0 else 0.0,
        "bytes_pushed": total("bytes_pushed"),
        "bytes_pulled": total("bytes_pulled"),
        "exchanges": total("exchanges"),
        "t_comp_seconds": total("t_comp"),
        "t_comm_seconds": t_comm,
        "t_wait_seconds": t_wait,
        # Exchange time that compute did not wait for (the exchanger thread hid it).
        "comm_hidden_fraction": 1.0 - t_wait / t_comm if t_comm > 0 else 0.0,
        "staleness_max": max((r.get("staleness_max", 0) for r in results), default=0),
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write via a temporary file and rename, so a reader never sees half a summary."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=_jsonable) + "\n")
    tmp.replace(path)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    return str(value)
