"""Held: a push or pull a shard holds from its arrival until it is answered."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ember.ps.clocks import WorkerEntry
from ember.ps.protocol import Exchange
from ember.wire import Request, SendTicket


@dataclass
class Held:
    request: Request  # what the wire received: the peer, and a push's payload frames
    exchange: Exchange  # what it asks
    worker: WorkerEntry
    payload: list[np.ndarray] | None  # read-only views of zmq's receive buffers, as they arrive
    folded: bool = False
    streaming: bool = False  # folded chunk by chunk as it arrives, each answered at once
    offset: int = 0  # keys folded so far while streaming
    reply: np.ndarray | None = None  # easgd's elastic difference, filled chunk by chunk
    pooled: bool = True  # the reply buffer returns to the pool (not a shared-memory view)
    tickets: list[SendTicket] = field(default_factory=list)
