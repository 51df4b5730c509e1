"""Run records: metrics.jsonl (and optional TensorBoard scalars) and the summary of a run.

imports: nothing of ember
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TextIO

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


def headline(scores: Mapping[str, Any]) -> tuple[str, float]:
    """The figure a line says of held-out scores: accuracy, else the first metric, else the
    loss, as ("accuracy", 0.98) or ("rmse", 0.12)."""
    keys = [k for k in scores if k.startswith("test_") and k != "test_loss"]
    key = "test_accuracy" if "test_accuracy" in keys else (keys or ["test_loss"])[0]
    return key.removeprefix("test_"), float(scores[key])


class Record:
    """One line of metrics.jsonl: its kind, then its fields in declaration order, with a field
    declared by `_merged()` spread flat into the line, so open-ended fields stay top-level keys."""

    __dataclass_fields__: ClassVar[dict[str, Any]]  # every subclass is a dataclass
    kind: ClassVar[str]

    def to_json(self) -> dict[str, Any]:
        line: dict[str, Any] = {"kind": self.kind}
        for spec in dataclasses.fields(self):
            value = getattr(self, spec.name)
            if spec.metadata.get(_MERGED):
                line.update(value)
            else:
                line[spec.name] = value
        return line


_MERGED = "merged"


def _merged(required: bool = False) -> Any:
    """A Mapping field whose keys to_json writes flat into the record (empty unless given)."""
    if required:
        return dataclasses.field(metadata={_MERGED: True})
    return dataclasses.field(default_factory=dict, metadata={_MERGED: True})


@dataclass(frozen=True, kw_only=True)
class WorkerStart(Record):
    kind = "start"
    rank: int  # the worker's rank (or a joiner's random id)
    incarnation: int  # how many times this rank was restarted before
    first_step: int  # the step it resumes from
    total_steps: int  # the step it trains up to


@dataclass(frozen=True, kw_only=True)
class WorkerProgress(Record):
    kind = "worker"
    rank: int  # the worker's rank
    incarnation: int  # which start of the rank reports
    step: int  # steps done, counted from 1
    epoch: int  # the epoch the step is in, counted from 1
    loss: float  # mean training loss since the previous record
    samples: int  # samples trained by this incarnation
    samples_per_second: float  # since the previous record
    t_comp: float  # seconds of compute so far, without waits on the network
    seconds: float = 0.0  # the training loop so far, without evaluation and checkpoints
    data_wait_fraction: float = 0.0  # share of the time since the previous record spent
    # waiting for batches (reading, shuffling): near 1, training is input-bound
    comm: Mapping[str, Any] = _merged()  # CommStats.as_record(): exchanges, bytes, staleness


@dataclass(frozen=True, kw_only=True)
class LoopProgress(Record):
    """ctx.report() in a loop ember.run runs: a progress record as the built-in loop's (the
    same kind, so the bar reads it alike), with the user's metrics as fields of their own."""

    kind = "worker"
    rank: int  # the worker's rank
    incarnation: int  # which start of the rank reports
    step: int  # optimizer steps done, counted from 1
    epoch: int  # the epoch of the latest batches served, counted from 1
    loss: float  # the loss reported, NaN when none was
    samples: int  # samples trained by this incarnation
    samples_per_second: float  # since the previous record
    t_comp: float  # seconds of the loop so far, without waits on the network
    comm: Mapping[str, Any] = _merged()  # CommStats.as_record(): exchanges, bytes, staleness
    reported: tuple[str, ...] = ()  # the names the user reported: TensorBoard scalars too
    metrics: Mapping[str, Any] = _merged()  # the user's metrics, by the names reported


@dataclass(frozen=True, kw_only=True)
class Evaluation(Record):
    kind = "eval"
    rank: int = 0  # only worker 0 evaluates
    epoch: int  # the epoch evaluated in, counted from 1
    step: int  # steps done, counted from 1
    epoch_end: bool  # at the epoch's last step; False: within it (--eval-every)
    seconds: float  # training so far, without evaluations and checkpoints
    samples: int  # every worker's samples so far, counted alike
    # on the held-out set: test_loss (the run's loss, mean per row) and test_<metric> each
    scores: Mapping[str, float] = _merged(required=True)
    source: str = "worker 0 local parameters"  # whose parameters were evaluated
    test_rows: int = 0  # held-out rows evaluated (Spark's tasks get a subset; 0: not said)


@dataclass(frozen=True, kw_only=True)
class Divergence(Record):
    kind = "diverged"
    rank: int  # the worker whose training loss stopped being finite
    incarnation: int  # which start of the rank saw it
    step: int  # the first step with a NaN or infinite loss, counted from 1
    epoch: int  # the epoch that step is in, counted from 1
    loss: str  # the loss at that step: "nan", "inf" or "-inf"


@dataclass(frozen=True, kw_only=True)
class WorkerDone(Record):
    kind = "done"
    rank: int  # the worker's rank
    incarnation: int  # which start of the rank finished
    steps: int  # steps this incarnation ran
    samples: int  # samples this incarnation trained
    seconds: float  # the training loop, without evaluation and checkpoints
    aside_seconds: float  # evaluation and checkpointing inside the loop
    t_comp: float  # seconds of compute, without waits on the network
    comm: Mapping[str, Any] = _merged()  # CommStats.as_record(): exchanges, bytes, staleness
    tau: Mapping[str, Any] = _merged()  # easgd: tau_policy, tau_final, tau_median
    data: Mapping[str, Any] = _merged()  # data_mode, rows_read, data_wait_seconds, ...
    device: str = "cpu"  # where it computed: cpu or cuda:N
    gpu: str | None = None  # the GPU address Spark assigned its task, used or not


@dataclass(frozen=True, kw_only=True)
class TauChoice(Record):
    kind = "tau"
    rank: int  # the worker whose communication period this is
    incarnation: int  # which start of the rank chose it
    step: int  # local steps done when it was chosen, counted from 1
    policy: str  # auto | loss
    reason: str  # start, measured (auto), loss (the loss trigger's period)
    tau: int  # the new period, in local steps
    previous: int | None  # the period before it; None at the start
    t_comp: float | None  # recent seconds per local step behind the choice
    t_comm: float | None  # recent seconds per exchange (wall time) behind it
    details: Mapping[str, Any] = _merged()  # the policy's own figures (docs/tau.md)


@dataclass(frozen=True, kw_only=True)
class WorkerError(Record):
    kind = "error"
    rank: int  # the worker that raised
    incarnation: int  # which start of the rank raised
    error: str  # the exception and its traceback
    retry: bool = True  # False: raised before its first step, as a restart would raise it again


@dataclass(frozen=True, kw_only=True)
class WorkerRestart(Record):
    kind = "restart"
    rank: int  # the worker restarted
    incarnation: int  # the incarnation it restarts as
    exitcode: int | None  # how the previous one exited; None when it raised
    error: str  # the previous one's traceback, if it sent one


@dataclass(frozen=True, kw_only=True)
class WorkerFailure(Record):
    kind = "failure"
    rank: int  # the worker that failed the run
    exitcode: int | None  # how it exited; None when it raised
    error: str  # its traceback, if it sent one


@dataclass(frozen=True, kw_only=True)
class JobFailure(Record):
    kind = "failure"
    error: str  # why the engine's training job failed, as its Python error


@dataclass(frozen=True, kw_only=True)
class RunEvent(Record):
    kind = "run"
    event: str  # what happened: start, resume, final checkpoint, stage retry, ...
    details: Mapping[str, Any] = _merged()  # the event's own fields (checkpoint, path, error, ...)


@dataclass(frozen=True, kw_only=True)
class ServerEvent(Record):
    kind = "server"
    details: Mapping[str, Any] = _merged(required=True)  # the servers' event: event, server, ...


@dataclass(frozen=True, kw_only=True)
class RunSummary(Record):
    kind = "summary"
    # of the final parameters on the held-out set: test_loss and test_<metric> each
    scores: Mapping[str, float] = _merged(required=True)


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

    def write(self, record: Record | Mapping[str, Any]) -> None:
        fields = record.to_json() if isinstance(record, Record) else record
        line = {"time": round(time.time() - self._started, 4), **fields}
        self._file.write(json_text(line) + "\n")
        self._file.flush()
        if self._writer is not None:
            tag = f"{line.get('kind', 'run')}/{line.get('rank', 'all')}"
            step = int(line.get("step", line.get("epoch", 0)))
            # the fixed scalars, each held-out metric, and the names a user loop reported
            found = (k for k in line if k.startswith(("test_", "user_")))
            keys = [*SCALARS, *found, *line.get("reported", ())]
            for key in dict.fromkeys(keys):
                if isinstance(line.get(key), (int, float)) and not isinstance(line[key], bool):
                    self._writer.add_scalar(f"{tag}/{key}", line[key], step)

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
        **_tau_summary(results),
        **_data_summary(results),
        **_device_summary(results),
    }


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
