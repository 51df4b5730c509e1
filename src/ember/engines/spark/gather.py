"""What a run's barrier tasks tell each other through BarrierTaskContext.allGather, one class a
message: JSON strings there, values here."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any, Self


@dataclass(frozen=True)
class TaskMessage:
    """A message every task sends once and reads from every task (`all_gather`)."""

    def encode(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def decode(cls, text: str) -> Self:
        values = json.loads(text)
        names = {field.name for field in fields(cls)}
        if not isinstance(values, dict) or set(values) != names:
            raise ValueError(f"a task's {cls.__name__} must hold {sorted(names)}, got {text!r}")
        return cls(**values)


@dataclass(frozen=True)
class Ready(TaskMessage):
    """Before training: the rows this task's partition holds, and a server (or rank 0's gloo
    store) it could not reach, with why; None when it reached them all."""

    rows: int
    unreachable: str | None


@dataclass(frozen=True)
class StoreAddress(TaskMessage):
    """allreduce's rank 0 to every task: the port its gloo store listens on (0 elsewhere),
    or why it could not open one."""

    port: int = 0
    error: str | None = None


def all_gather(context: Any, message: TaskMessage) -> list[Any]:
    """Every task's message, in rank order (one allGather: about a second)."""
    return [type(message).decode(text) for text in context.allGather(message.encode())]
