"""Reading a file a user hands ember (a checkpoint's parts, a join file): regular files only,
never more bytes than a bound, and JSON that cannot exhaust the parser's stack.

imports: nothing of ember
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any


class Unreadable(Exception):
    """Why a user's file cannot be read; the caller names the file and raises its own error."""


def read_regular(path: Path, limit: int) -> bytes:
    """At most `limit` bytes of the regular file at `path`. Anything else (a FIFO, a device such
    as /dev/zero behind a symlink, a directory) is refused from its stat, never read."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise Unreadable("not a regular file")
        # O_NONBLOCK: a FIFO swapped in after the stat cannot block the open; fstat refuses it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with open(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise Unreadable("not a regular file")
            # read(n) allocates n bytes before it reads one: never ask for more than the
            # file holds (plus one, to see it grew), whatever size the caller was told.
            return f.read(max(0, min(limit, info.st_size + 1)))
    except FileNotFoundError:
        raise Unreadable("missing") from None
    except OSError as exc:
        raise Unreadable(exc.strerror or str(exc)) from None


def parse_json(data: bytes) -> Any:
    """JSON only, never pickle; ValueError for anything that is not JSON, nesting deep enough
    to exhaust the parser's stack included."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("nested too deeply") from None
