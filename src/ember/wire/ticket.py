"""SendTicket: when a zero-copy send no longer reads its buffers (imports zmq, nothing of ember)."""

from __future__ import annotations

from collections.abc import Iterable

import zmq


class SendTicket:
    """Says when zmq has finished reading the buffers one or more zero-copy sends handed it;
    until `done`, the sender must neither modify nor reuse them."""

    __slots__ = ("_tracker",)

    def __init__(self, tracker: zmq.MessageTracker | None = None) -> None:
        self._tracker = tracker  # None: nothing is read any more (the bytes were copied)

    @property
    def done(self) -> bool:
        return self._tracker is None or self._tracker.done

    @classmethod
    def joined(cls, tickets: Iterable[SendTicket]) -> SendTicket:
        """One ticket that is done once every one of `tickets` is."""
        trackers = [t._tracker for t in tickets if t._tracker is not None]
        return cls(zmq.MessageTracker(*trackers)) if trackers else COPIED


COPIED = SendTicket()  # for bytes copied at once, e.g. into a shared-memory region
