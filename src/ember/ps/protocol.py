"""What a server and its clients say: the operations (Op) and the checks of a request
header's fields, which arrive as msgpack maps from any peer."""

from __future__ import annotations

from enum import Enum
from typing import Any

from ember.errors import ProtocolError


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


WORKER_OPS = frozenset({Op.REGISTER, Op.PUSH, Op.PULL, Op.DONE})  # only a primary serves them


def header_int(
    header: dict[str, Any], key: str, minimum: int | None = None, maximum: int | None = None
) -> int:
    value = header.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProtocolError(f"header field {key!r} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ProtocolError(f"header field {key!r} must be >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ProtocolError(f"header field {key!r} must be <= {maximum}, got {value!r}")
    return value


def header_bool(header: dict[str, Any], key: str) -> bool:
    """An optional flag: absent is False."""
    value = header.get(key, False)
    if not isinstance(value, bool):
        raise ProtocolError(f"header field {key!r} must be true or false, got {value!r}")
    return value
