"""What a member and shard 0 say of the data cursor's pieces (pieces.py): Take, a member's
word on its pieces and its ask for the next, and Dealt, the reply. Every request names the
run's cut of the rows, so that a member reading other data is refused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ember.errors import ProtocolError
from ember.ps.pieces import MAX_EPOCHS, MAX_PIECES, Geometry, Key, count
from ember.ps.protocol import MAX_STEP, MAX_WORKER_ID, FieldError, header_bool, header_int


@dataclass(frozen=True, kw_only=True)
class Take:
    """A member's word on its pieces: it `started` one, `finished` one, gives one back
    (`returned`), and with `take` asks for a piece of `epoch`; answered with Dealt. Every
    request names the run's cut, so that a member reading other data is refused."""

    worker: int
    incarnation: int
    seq: int
    epoch: int
    geometry: Geometry
    take: bool = True
    batch: int = 0  # the member's batch size: rows a step (0: not said)
    step: int | None = None  # with `started`: the member's own steps done before the piece
    started: Key | None = None
    finished: Key | None = None
    returned: Key | None = None

    def header(self) -> dict[str, Any]:
        g = self.geometry
        fields: dict[str, Any] = {
            "op": "piece",
            "worker": self.worker,
            "incarnation": self.incarnation,
            "seq": self.seq,
            "epoch": self.epoch,
            "cut": [g.rows, g.piece_rows, g.epochs],
            "take": self.take,
        }
        if self.batch:
            fields["batch"] = self.batch
        if self.step is not None:
            fields["step"] = self.step
        for name in ("started", "finished", "returned"):
            key = getattr(self, name)
            if key is not None:
                fields[name] = list(key)
        return fields

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Take:
        cut = header.get("cut")
        if not (isinstance(cut, list) and len(cut) == 3 and all(count(v) for v in cut)):
            message = f"a piece request's cut must be [rows, piece_rows, epochs], got {cut!r}"
            raise FieldError("cut", message)
        geometry = Geometry(*cut)
        if geometry.pieces > MAX_PIECES or geometry.epochs > MAX_EPOCHS:
            message = f"{cut} cuts more than {MAX_PIECES} pieces or {MAX_EPOCHS} epochs"
            raise FieldError("cut", message)
        epoch = header_int(header, "epoch", 0, MAX_EPOCHS)
        keys = {name: _key(header, name, geometry) for name in ("started", "finished", "returned")}
        return cls(
            worker=header_int(header, "worker", 0, MAX_WORKER_ID),
            incarnation=header_int(header, "incarnation", 0),
            seq=header_int(header, "seq"),
            epoch=epoch,
            geometry=geometry,
            take=header_bool(header, "take"),
            batch=header_int(header, "batch", 1, geometry.piece_rows) if "batch" in header else 0,
            step=header_int(header, "step", 0, MAX_STEP) if "step" in header else None,
            **keys,
        )


@dataclass(frozen=True, kw_only=True)
class Dealt:
    """The reply to Take: the `piece` leased, or `wait` and ask again, or neither: nothing is
    left up to the epoch asked for."""

    seq: int
    piece: Key | None = None
    wait: bool = False

    def header(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"op": "ok", "seq": self.seq}
        if self.piece is not None:
            fields["piece"] = list(self.piece)
        if self.wait:
            fields["wait"] = True
        return fields

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Dealt:
        piece = header.get("piece")
        if piece is not None and not (
            isinstance(piece, list) and len(piece) == 2 and all(count(v, 0) for v in piece)
        ):
            raise ProtocolError(f"a piece reply names no piece: {piece!r}")
        return cls(
            seq=header_int(header, "seq"),
            piece=None if piece is None else (piece[0], piece[1]),
            wait=header_bool(header, "wait"),
        )


def _key(header: dict[str, Any], name: str, geometry: Geometry) -> Key | None:
    value = header.get(name)
    if value is None:
        return None
    if not (
        isinstance(value, list)
        and len(value) == 2
        and count(value[0], 0)
        and count(value[1], 0)
        and value[0] < geometry.epochs
        and value[1] < geometry.pieces
    ):
        message = f"header field {name!r} must be [epoch, piece] of the cut, got {value!r}"
        raise FieldError(name, message)
    return (value[0], value[1])
