"""Sessions: a server's session key for each authenticated peer, the connection it was made
on, and the peers whose connection closed, whose sessions go a little later."""

from __future__ import annotations

import time
from collections.abc import Iterator

# A closed connection's messages read after its close keep their session this long (a record
# or `done` sent just before closing); headers are sealed, so nobody else can use it.
CLOSING_SECONDS = 2.0


class Sessions:
    def __init__(self) -> None:
        self._keys: dict[bytes, bytes] = {}  # peer -> session key
        self._fds: dict[bytes, int] = {}  # peer -> the connection it was made on
        self._closing: dict[bytes, float] = {}  # peer -> when its session goes

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._keys)

    def key(self, peer: bytes, fd: int | None = None) -> bytes | None:
        """`peer`'s session key; with `fd`, only if the session was made on that connection
        (another connection presenting the id does not hold it)."""
        if fd is not None and self._fds.get(peer) != fd:
            return None
        return self._keys.get(peer)

    def made_on(self, peer: bytes, fd: int) -> bool:
        return self._fds.get(peer) == fd

    def open(self, peer: bytes, key: bytes, fd: int) -> None:
        self._keys[peer], self._fds[peer] = key, fd

    def end(self, peer: bytes) -> None:
        """Forget `peer`'s session now: nothing more of it is read or answered."""
        self._keys.pop(peer, None)
        self._fds.pop(peer, None)

    def closing(self, peer: bytes) -> None:
        self._closing[peer] = time.monotonic() + CLOSING_SECONDS

    def is_closing(self, peer: bytes) -> bool:
        return peer in self._closing

    def expired(self) -> list[bytes]:
        """The closed connections' peers whose sessions went now."""
        now = time.monotonic()
        gone = [peer for peer, until in self._closing.items() if until <= now]
        for peer in gone:
            del self._closing[peer]
            self.end(peer)
        return gone
