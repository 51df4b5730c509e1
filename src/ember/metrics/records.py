"""Every record a worker, an engine or a server writes to metrics.jsonl, one class per kind: the
one place a record's "kind" is named. A record is a dict only where it crosses a process
boundary (a worker's pipe, a Spark task's rows, the file): `to_json` and `Record.from_json`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

_MERGED = "merged"  # a Mapping field whose keys to_json writes flat into the line
_OMITTED = "omitted"  # a field to_json leaves out while it is None
RECORDS: dict[str, type[Record]] = {}  # kind -> its class, filled as each class is defined


def _merged(required: bool = False) -> Any:
    """A Mapping field whose keys to_json writes flat into the record (empty unless given)."""
    if required:
        return dataclasses.field(metadata={_MERGED: True})
    return dataclasses.field(default_factory=dict, metadata={_MERGED: True})


def _omitted() -> Any:
    """An optional field that is in the line only when it was given."""
    return dataclasses.field(default=None, metadata={_OMITTED: True})


@dataclass(frozen=True, kw_only=True)
class Record:
    """One line of metrics.jsonl: its kind, then its fields in declaration order, with a field
    declared by `_merged()` spread flat into the line, so open-ended fields stay top-level keys."""

    kind: ClassVar[str]
    # which start of its rank sent it: a field of its own in the records of a worker's life,
    # on Spark a tag on every record a task sends (a new incarnation is a new stage attempt)
    incarnation: int | None = _omitted()
    attempt: int | None = _omitted()  # the driver's count of Spark's stage attempts

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("kind") is not None:
            taken = RECORDS.setdefault(cls.kind, cls)
            assert taken is cls, f"{cls.__name__} takes kind {cls.kind!r} of {taken.__name__}"

    def to_json(self) -> dict[str, Any]:
        line: dict[str, Any] = {"kind": self.kind}
        for spec in _in_order(type(self)):
            value = getattr(self, spec.name)
            if spec.metadata.get(_MERGED):
                line.update(value)
            elif not (spec.metadata.get(_OMITTED) and value is None):
                line[spec.name] = value
        return line

    @staticmethod
    def from_json(line: Mapping[str, Any]) -> Record:
        """The record a line says, by its kind. A key no field names goes to the class's last
        merged field (the one for open-ended figures); "time" is the log's, not the record's."""
        kind = line.get("kind")
        cls = RECORDS.get(kind) if isinstance(kind, str) else None
        if cls is None:
            raise ValueError(f"unknown record kind {kind!r}; known: {', '.join(sorted(RECORDS))}")
        fields = dataclasses.fields(cls)
        named = {f.name for f in fields if not f.metadata.get(_MERGED)}
        merged = [f.name for f in fields if f.metadata.get(_MERGED)]
        values: dict[str, Any] = {k: v for k, v in line.items() if k in named}
        rest = {k: v for k, v in line.items() if k not in named and k not in ("kind", "time")}
        if rest and not merged:
            raise ValueError(f"a {kind!r} record has no field {sorted(rest)[0]!r}")
        for name in merged:
            values[name] = rest if name == merged[-1] else {}
        try:
            return cls(**values)
        except TypeError as exc:
            raise ValueError(f"a {kind!r} record: {exc}") from None

    def flat(self) -> dict[str, Any]:
        """The record's fields as one flat mapping, as its line has them, without its kind."""
        line = self.to_json()
        del line["kind"]
        return line


def _in_order(cls: type[Record]) -> tuple[dataclasses.Field[Any], ...]:
    """A record's fields in the order its class declares them, the envelope (incarnation and
    attempt, where the class does not declare them) last: a line reads as it always has."""
    order = _ORDERS.get(cls)
    if order is None:
        own = list(cls.__annotations__)
        rank = {name: i for i, name in enumerate(own)}
        fields = dataclasses.fields(cls)
        order = _ORDERS[cls] = tuple(sorted(fields, key=lambda f: rank.get(f.name, len(own))))
    return order


_ORDERS: dict[type[Record], tuple[dataclasses.Field[Any], ...]] = {}  # computed once a class


@dataclass(frozen=True, kw_only=True)
class WorkerStart(Record):
    kind = "start"
    rank: int  # the worker's rank (or a joiner's random id)
    incarnation: int  # how many times this rank was restarted before
    first_step: int  # the step it resumes from
    total_steps: int  # the step it trains up to
    # a joiner's: the run's step its learning-rate schedule starts at (the run's own workers')
    schedule_step: int | None = _omitted()


@dataclass(frozen=True, kw_only=True)
class WorkerProgress(Record):
    """A worker's progress: the built-in loop's, or ctx.report() in a loop ember.run runs, with
    the user's metrics as fields of their own."""

    kind = "worker"
    rank: int  # the worker's rank
    incarnation: int  # which start of the rank reports
    step: int  # steps done, counted from 1
    epoch: int  # the epoch the step is in, counted from 1
    loss: float  # mean training loss since the previous record; NaN when a loop reported none
    samples: int  # samples trained by this incarnation
    samples_per_second: float  # since the previous record
    t_comp: float  # seconds of compute so far, without waits on the network
    # the built-in loop's: the training loop so far, without evaluation and checkpoints
    seconds: float | None = _omitted()
    # the built-in loop's: share of the time since the previous record spent waiting for
    # batches (reading, shuffling); near 1, training is input-bound
    data_wait_fraction: float | None = _omitted()
    lr: float | None = _omitted()  # the built-in loop's learning rate at the record's step
    comm: Mapping[str, Any] = _merged()  # CommStats.as_record(): exchanges, bytes, staleness
    reported: tuple[str, ...] | None = _omitted()  # a user loop's names: TensorBoard scalars
    metrics: Mapping[str, Any] = _merged()  # a user loop's metrics, by the names reported


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
    test_set: str | None = _omitted()  # the launcher's word on those rows: all, or a subset


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
    left: bool | None = _omitted()  # it left a worker range's run before its steps were done


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
    incarnation: int = 0  # which start of the rank raised
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
class Failure(Record):
    """The run failed: for a worker (its rank, how it exited) or for the engine's job."""

    kind = "failure"
    rank: int | None = _omitted()  # the worker that failed the run; None: the engine's job
    exitcode: int | None = None  # how the worker exited; None when it raised
    error: str  # its traceback, or the job's Python error


@dataclass(frozen=True, kw_only=True)
class Returned(Record):
    """What rank 0's function returned under ember.run, encoded (worker/returns.py), or why it
    could not be: the launcher's, never written to metrics.jsonl."""

    kind = "returned"
    rank: int = 0
    value: str | None = None  # base64 of the msgpack bytes
    error: str | None = None  # why the value could not be encoded


@dataclass(frozen=True, kw_only=True)
class Note(Record):
    """A line a worker has for the user (said once, however many workers say it)."""

    kind = "note"
    rank: int
    text: str


@dataclass(frozen=True, kw_only=True)
class Unreachable(Record):
    """A Spark task could not reach a server before its first step."""

    kind = "unreachable"
    rank: int
    error: str  # the address it tried and what happened


@dataclass(frozen=True, kw_only=True)
class FinalState(Record):
    """Spark's allreduce: rank 0's final parameters, returned to the driver (megabytes: never
    a metric), and where it met the others; an ember.run loop's only where the run knows its
    model."""

    kind = "state"
    rank: int = 0
    rendezvous: str  # the address of the group's rendezvous
    step: int = 0  # the step the parameters are from
    size: int = 0  # how many float32 parameters
    params: str | None = None  # their bytes, base64


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
