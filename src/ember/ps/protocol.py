"""What a shard and its clients say to each other, one class a message: the operations (Op),
the requests a worker makes (Register, Exchange, Done), the replies it reads (Joined, Answer,
Snapshot), a primary's Copy to its backup, and the launcher's Promote. Headers travel as
msgpack maps (wire/frames.py); `header()` encodes a message and `from_header` decodes one,
checking every field, so past this module a shard and a client handle values, never a dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar, Self, TypeGuard

from ember.errors import ProtocolError
from ember.ps.clockrows import COLUMNS
from ember.ps.codec import IDENTITY, Codec, codec_named


class Op(str, Enum):
    """The operations a server answers (a request header's `op`); equal to, hashed like and
    printed as the name on the wire."""

    def __str__(self) -> str:
        return str(self.value)

    REGISTER = "register"
    PUSH = "push"
    PULL = "pull"
    DONE = "done"
    SNAPSHOT = "snapshot"
    STATS = "stats"
    STOP = "stop"
    REPLICATE = "replicate"
    PROMOTE = "promote"
    PIECE = "piece"  # the data cursor's (pieces.py)


WORKER_OPS = frozenset({Op.REGISTER, Op.PUSH, Op.PULL, Op.DONE})  # only a primary serves them
PRIMARY_OPS = WORKER_OPS | {Op.PIECE}
OPS = {op.value: op for op in Op}  # a dict: an Enum's own lookup costs a microsecond a request
EXCHANGES = frozenset({Op.PUSH, Op.PULL})
MAX_WORKER_ID = (1 << 63) - 1  # the clock table's int64 column
# A worker's step, its resume point: beyond any run, exact as a float64 in a checkpoint's JSON,
# and far inside the clock table's int64 columns.
MAX_STEP = 1 << 53


class FieldError(ProtocolError):
    """A header field missing, of the wrong type or out of range; `field` names it, and the
    shard counts refusals by it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


# ---- a worker's requests ------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Membership:
    """A request that names only who sends it: Register and Done."""

    op: ClassVar[Op]
    worker: int
    incarnation: int
    seq: int

    def header(self) -> dict[str, Any]:
        return {
            "op": self.op.value,
            **{k: getattr(self, k) for k in ("worker", "incarnation", "seq")},
        }

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Self:
        return cls(
            worker=header_int(header, "worker", 0, MAX_WORKER_ID),
            incarnation=header_int(header, "incarnation", 0),
            seq=header_int(header, "seq"),
        )


class Register(Membership):
    """Join the shard as `worker`'s `incarnation`; answered with Joined."""

    op = Op.REGISTER


class Done(Membership):
    """`worker` leaves: synchronous peers stop waiting for it."""

    op = Op.DONE


@dataclass(frozen=True, kw_only=True)
class Exchange:
    """A push (its payload the worker's gradient or parameters for `keys`) or a pull;
    answered with Answer. `pull` on a push asks for the parameters back in the same reply."""

    op: Op
    worker: int
    incarnation: int
    seq: int
    step: int  # the worker's own step, its resume point
    pull: bool = False
    resync: bool = False  # full precision, making the server's view of this worker anew
    codec: Codec = IDENTITY
    tau: int | None = None  # a period rank 0 names for every worker (diloco, --tau auto)
    keys: tuple[int, int] | None = None  # a push's key range

    @property
    def answers_params(self) -> bool:
        """Whether the reply carries the shard's parameters."""
        return self.op is Op.PULL or self.pull

    def header(self) -> dict[str, Any]:
        fields: dict[str, Any] = {  # written out: a client sends one per shard per exchange
            "op": self.op.value,
            "worker": self.worker,
            "incarnation": self.incarnation,
            "seq": self.seq,
            "step": self.step,
        }
        if self.pull:
            fields["pull"] = True
        if self.codec.compresses:
            fields.update(codec=self.codec.name, resync=self.resync)
        if self.tau is not None:
            fields["tau"] = self.tau
        if self.keys is not None:
            fields["keys"] = list(self.keys)
        return fields

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Exchange:
        keys = header.get("keys")
        if keys is not None and not (
            isinstance(keys, list) and len(keys) == 2 and all(_is_int(k) for k in keys)
        ):
            raise FieldError("keys", f"header field 'keys' must be [start, stop], got {keys!r}")
        name = header.get("codec")
        try:
            codec = codec_named(IDENTITY.name if name is None else name)
        except ProtocolError as exc:
            raise FieldError("codec", f"header field 'codec': {exc}") from None
        return cls(
            op=OPS[header["op"]],
            worker=header_int(header, "worker", 0, MAX_WORKER_ID),
            incarnation=header_int(header, "incarnation", 0),
            seq=header_int(header, "seq"),
            step=header_int(header, "step", 0, MAX_STEP),
            pull=header_bool(header, "pull"),
            resync=header_bool(header, "resync"),
            codec=codec,
            tau=header_int(header, "tau", 1, MAX_STEP) if "tau" in header else None,
            keys=None if keys is None else (keys[0], keys[1]),
        )


WorkerRequest = Register | Exchange | Done


def worker_request(header: dict[str, Any]) -> WorkerRequest:
    """A worker op's header as its message (the caller has checked the op is one)."""
    op = OPS[header["op"]]
    if op is Op.REGISTER:
        return Register.from_header(header)
    if op is Op.DONE:
        return Done.from_header(header)
    return Exchange.from_header(header)


@dataclass(frozen=True, kw_only=True)
class Promote:
    """The launcher's word to a backup whose primary died: serve, and copy to `backup`."""

    backup: str | None = None

    def header(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"op": Op.PROMOTE.value, "seq": 0}
        if self.backup is not None:
            fields["backup"] = self.backup
        return fields

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Promote:
        backup = header.get("backup")
        if backup is not None and not (isinstance(backup, str) and backup.startswith("tcp://")):
            raise FieldError("backup", f"promote: backup must be a tcp:// address, got {backup!r}")
        return cls(backup=backup)


@dataclass(frozen=True, kw_only=True)
class Copy:
    """A primary's state for its backup: the tensors `names`, then the clock table as the
    last payload tensor (rows of clockrows.COLUMNS, a table of any size), at `step`, with
    the open round as (count, clock)."""

    names: tuple[str, ...]
    step: int
    round: tuple[int, int]

    def header(self) -> dict[str, Any]:
        return {
            "op": Op.REPLICATE.value,
            "seq": 0,
            "names": list(self.names),
            "step": self.step,
            "round": list(self.round),
            "workers": list(COLUMNS),
        }

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Copy:
        names, step = _tensors_and_step(header)
        round_ = header.get("round")
        if not (
            isinstance(round_, list)
            and len(round_) == 2
            and all(_is_int(value) and value >= 0 for value in round_)
        ):
            raise FieldError("round", f"round must be [count, clock], got {round_!r}")
        return cls(names=names, step=step, round=(round_[0], round_[1]))


def _tensors_and_step(header: dict[str, Any]) -> tuple[tuple[str, ...], int]:
    """The tensor names and step of a shard's state as a Copy or a Snapshot carries it."""
    names, workers, step = header.get("names"), header.get("workers"), header.get("step")
    if not (isinstance(names, list) and all(isinstance(name, str) for name in names)):
        raise FieldError("names", f"names must be a list of tensor names, got {names!r}")
    if workers != list(COLUMNS):
        message = f"workers must name the clock table's columns {list(COLUMNS)}, got"
        raise FieldError("workers", f"{message} {workers!r}")
    if not (_is_int(step) and step >= 0):
        raise FieldError("step", f"step is {step!r}")
    return tuple(names), step


# ---- a shard's replies ------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Joined:
    """The reply to Register: where the worker's numbers go on from, and the shard's keys."""

    clock: int
    step: int
    keys: tuple[int, int]
    run_step: int = 0  # where the run's schedule stands (ClockTable.run_step)

    def header(self) -> dict[str, Any]:
        numbers = {"clock": self.clock, "step": self.step, "run_step": self.run_step}
        return {"op": "ok", **numbers, "keys": list(self.keys)}

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Joined:
        keys = header.get("keys")
        if not (isinstance(keys, list) and len(keys) == 2 and all(_is_int(k) for k in keys)):
            raise FieldError("keys", f"a registration's reply names no keys: {keys!r}")
        return cls(
            clock=header_int(header, "clock", 0),
            step=header_int(header, "step", 0),
            keys=(keys[0], keys[1]),
            run_step=header_int(header, "run_step", 0),
        )


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """The reply to a snapshot: the shard's tensors `names` at `step`, then its clock table
    as the last payload tensor, as a Copy carries them."""

    names: tuple[str, ...]
    step: int

    def header(self) -> dict[str, Any]:
        return {"op": "ok", "names": list(self.names), "step": self.step, "workers": list(COLUMNS)}

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Snapshot:
        names, step = _tensors_and_step(header)
        return cls(names=names, step=step)


@dataclass(frozen=True, kw_only=True)
class Answer:
    """The reply to an Exchange. `staleness` counts the updates others made since this
    worker's last read; `view` says whether the shard now holds the worker's view (codecs);
    `add`: the encoded tensor is a difference to add, not values; `duplicate`: the request
    was seen before and not applied again."""

    seq: int
    clock: int | None = None
    step: int | None = None
    staleness: int = 0
    tau: int | None = None
    codec: str | None = None
    view: bool | None = None
    add: bool = False
    duplicate: bool = False

    def header(self) -> dict[str, Any]:
        # written out field by field: a shard answers every exchange with one
        fields: dict[str, Any] = {"op": "ok", "seq": self.seq}
        if self.clock is not None:
            fields.update(clock=self.clock, step=self.step, staleness=self.staleness)
        if self.tau is not None:
            fields["tau"] = self.tau
        if self.codec is not None:
            fields["codec"] = self.codec
        if self.view is not None:
            fields["view"] = self.view
        if self.add:
            fields["add"] = True
        if self.duplicate:
            fields["duplicate"] = True
        return fields

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Answer:
        tau, codec, view = header.get("tau"), header.get("codec"), header.get("view")
        return cls(
            seq=header_int(header, "seq"),
            clock=header_int(header, "clock") if "clock" in header else None,
            step=header_int(header, "step") if "step" in header else None,
            staleness=header_int(header, "staleness", 0) if "staleness" in header else 0,
            # a period is only taken when it is a valid one
            tau=tau if _is_int(tau) and tau >= 1 else None,
            codec=codec if isinstance(codec, str) else None,
            view=None if view is None else bool(view),
            add=header_bool(header, "add"),
            duplicate=header_bool(header, "duplicate"),
        )


def header_int(
    header: dict[str, Any], key: str, minimum: int | None = None, maximum: int | None = None
) -> int:
    value = header.get(key)
    if not _is_int(value):
        raise FieldError(key, f"header field {key!r} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise FieldError(key, f"header field {key!r} must be >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise FieldError(key, f"header field {key!r} must be <= {maximum}, got {value!r}")
    return value


def header_bool(header: dict[str, Any], key: str) -> bool:
    """An optional flag: absent is False."""
    value = header.get(key, False)
    if not isinstance(value, bool):
        raise FieldError(key, f"header field {key!r} must be true or false, got {value!r}")
    return value


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
