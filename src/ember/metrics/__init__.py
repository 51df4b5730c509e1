"""Run records: metrics.jsonl (and optional TensorBoard scalars) and the summary of a run. The
records themselves, one class per kind, are records.py's; tracking.py logs a run to MLflow.

imports: errors
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from ember.metrics.records import Record

SCALARS = (
    "loss",
    "lr",
    "samples_per_second",
    "t_comp",
    "t_comm",
    "t_wait",
    "staleness_max",
    "test_accuracy",
    "test_loss",
)


NOT_SCORES = ("test_rows", "test_set")  # an evaluation's word on its rows, not a curve


def headline(scores: Mapping[str, Any]) -> tuple[str, float]:
    """The figure a line says of held-out scores: accuracy, else the first metric, else the
    loss, as ("accuracy", 0.98) or ("rmse", 0.12)."""
    keys = [k for k in scores if k.startswith("test_") and k != "test_loss"]
    key = "test_accuracy" if "test_accuracy" in keys else (keys or ["test_loss"])[0]
    return key.removeprefix("test_"), float(scores[key])


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

    def write(self, record: Record) -> None:
        line = {"time": round(time.time() - self._started, 4), **record.to_json()}
        self._file.write(json_text(line) + "\n")
        self._file.flush()
        if self._writer is not None:
            tag = f"{line.get('kind', 'run')}/{line.get('rank', 'all')}"
            step = int(line.get("step", line.get("epoch", 0)))
            # the fixed scalars, each held-out metric, and the names a user loop reported
            found = (k for k in line if k.startswith(("test_", "user_")) and k not in NOT_SCORES)
            keys = [*SCALARS, *found, *line.get("reported", ())]
            for key in dict.fromkeys(keys):
                if isinstance(line.get(key), (int, float)) and not isinstance(line[key], bool):
                    self._writer.add_scalar(f"{tag}/{key}", line[key], step)

    def close(self) -> None:
        self._file.close()
        if self._writer is not None:
            self._writer.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl's lines as they are, dicts."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_records(path: Path) -> list[Record]:
    """metrics.jsonl's lines as records, a class per kind (records.py)."""
    return [Record.from_json(line) for line in read_metrics(path)]


def collapse(
    history: list[Mapping[str, float]], final: Mapping[str, float], classes: int
) -> dict[str, Any] | None:
    """How the final model fell from what worker 0's evaluations (`history`, in order) saw, or
    None: its accuracy back at chance (within a tenth of the gain the best evaluation had
    over chance), or, without accuracy, its loss over 3x the first evaluation's. A
    non-finite loss is the summary's `diverged`; this is a model that trained, then lost it
    (diloco at too short a period, an outer step too large)."""
    chance = 1 / max(2, classes)
    accuracies = [s["test_accuracy"] for s in history if "test_accuracy" in s]
    best, accuracy = max(accuracies, default=chance), final.get("test_accuracy", chance)
    if best - chance >= 0.1 and accuracy - chance <= 0.1 * (best - chance):
        said = (
            f"training collapsed: the final model's test accuracy is {accuracy:.4f}, at"
            f" chance ({chance:.2f}), after worker 0's evaluations reached {best:.4f}"
        )
        return {"best_test_accuracy": best, "test_accuracy": accuracy, "said": said}
    if accuracies:  # a classifier: its accuracy says it; a loss can rise as it grows sure
        return None
    losses = [s["test_loss"] for s in history if math.isfinite(s.get("test_loss", math.nan))]
    loss = final.get("test_loss", math.nan)
    if losses and math.isfinite(loss) and losses[0] > 0 and loss > 3 * losses[0]:
        said = (
            f"training collapsed: the final model's test loss is {loss:.4g}, over 3x worker"
            f" 0's first evaluation's {losses[0]:.4g}"
        )
        return {"first_test_loss": losses[0], "test_loss": loss, "said": said}
    return None


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
        **_tau_summary(results),
        **_data_summary(results),
        **_device_summary(results),
    }


def count_dealt_rows(summary: dict[str, Any]) -> None:
    """A worker range's samples are the rows its servers dealt and saw trained (joiners and
    dead incarnations too, whose last records the launcher may never get)."""
    if "epoch_rows" in summary:
        rows = sum(summary["epoch_rows"]) + summary.get("rows_trained_twice", 0)
        seconds = summary["train_seconds"]
        summary.update(samples=rows, samples_per_second=rows / seconds if seconds > 0 else 0.0)


def _device_summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Where each worker computed, the GPUs several workers shared (ranks by device), and
    each Spark task's assigned GPU where it had one."""
    found = {str(r["rank"]): r.get("device", "cpu") for r in results if "rank" in r}
    gpus = {str(r["rank"]): r["gpu"] for r in results if r.get("gpu") is not None}
    ranks: dict[str, list[int]] = {}
    for rank, device in found.items():
        if device != "cpu":
            ranks.setdefault(device, []).append(int(rank))
    shared = {device: sorted(on) for device, on in ranks.items() if len(on) > 1}
    return {
        "devices": found,
        **({"gpus_shared": shared} if shared else {}),
        **({"gpu_addresses": gpus} if gpus else {}),
    }


def _data_summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """How the workers got their rows: the mode, and per worker the rows read and the seconds
    the step waited for its batches (blocked on the disk, of those, for a stream)."""
    counted = [r for r in results if "data_mode" in r]
    if not counted:
        return {}
    per_worker = {
        str(r["rank"]): {
            "rows_read": r["rows_read"],
            "data_wait_seconds": r["data_wait_seconds"],
            "read_wait_seconds": r["read_wait_seconds"],
            "peak_rss_bytes": r.get("peak_rss_bytes", 0),
        }
        for r in counted
    }
    return {
        "data_mode": counted[0]["data_mode"],
        "rows_read": sum(r["rows_read"] for r in counted),
        "data_wait_seconds": sum(r["data_wait_seconds"] for r in counted),
        "data_per_worker": per_worker,
    }


def _tau_summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """easgd's communication period: its policy, and each worker's last and median tau."""
    periods = [r for r in results if "tau_final" in r]
    if not periods:
        return {}
    return {
        "tau_policy": periods[0].get("tau_policy"),
        "tau_per_worker": {
            str(r["rank"]): {"final": r["tau_final"], "median": r["tau_median"]} for r in periods
        },
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write via a temporary file and rename, so a reader never sees half a summary."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json_text(data, indent=2) + "\n")
    tmp.replace(path)


def json_text(value: Any, indent: int | None = None) -> str:
    """`value` as strict JSON, for files a user's tools read: a NaN or infinite float becomes
    null, since a bare NaN or Infinity is no JSON and strict parsers refuse the whole file."""
    return json.dumps(_finite(value), indent=indent, default=jsonable, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return _finite(value.item())
    if isinstance(value, (set, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    return str(value)
