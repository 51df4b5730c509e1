"""How many lanes (lanes.py) a connection stripes over: the count this process's run names
(--wire-lanes), or with "auto" the one a probe at connect measured best. The probe times a
payload the server reads and discards over 1, 2, 4... lanes, and moves to a larger count only
when it is PROBE_GAIN times as fast as the count kept so far: a second stream pays only where
one cannot fill the link, and costs where the host's cores, not the stream, are the limit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ember.wire.connection import ClientConnection
from ember.wire.lanes import MAX_LANES, PROBE_BYTES

# A larger count is kept only when it is at least this much faster than the count kept so far:
# on a 2-core host at 10 Gbit/s, where lanes cost, two probes of 38 saw 1.18x and 1.19x of noise.
PROBE_GAIN = 1.25
_setting: str = "auto"


def use_wire_lanes(setting: str | int) -> None:
    """This process's lane count for connections that do not share memory: "auto" (probe
    each connection) or a count from 1 to MAX_LANES."""
    global _setting
    _setting = lane_setting(str(setting))


def lane_setting(text: str) -> str:
    if text != "auto" and not (text.isdigit() and 1 <= int(text) <= MAX_LANES):
        raise ValueError(f"wire lanes must be 'auto' or 1 to {MAX_LANES}, not {text!r}")
    return text


def wire_lanes() -> str:
    return _setting


@dataclass(frozen=True)
class LaneChoice:
    """How many lanes a connection uses, and the probe's rates (bytes/s) by lane count."""

    lanes: int
    rates: dict[int, float]

    def describe(self) -> str:
        tried = ", ".join(f"{n}: {r * 8 / 1e9:.2f}" for n, r in sorted(self.rates.items()))
        return f"{self.lanes} lane(s) (probe, Gbit/s by lanes: {tried})"


def probe(connection: ClientConnection, most: int, payload_bytes: int = PROBE_BYTES) -> LaneChoice:
    """Time `payload_bytes` sent over 1, 2, 4... lanes (up to `most`), best of two tries
    each, and leave the connection on the count chosen (see the module's docstring)."""
    if connection.shared:
        raise ValueError("a connection that shares memory has nothing to stripe: not probed")
    payload = np.zeros(payload_bytes // 4, np.float32)
    rates: dict[int, float] = {}
    count = 1
    while count <= most:
        connection.set_lanes(count)
        rates[count] = max(_rate(connection, payload) for _ in range(2))
        count *= 2
    chosen = 1
    for count in sorted(rates):
        if rates[count] >= PROBE_GAIN * rates[chosen]:
            chosen = count
    connection.set_lanes(chosen)
    return LaneChoice(chosen, rates)


def _rate(connection: ClientConnection, payload: np.ndarray) -> float:
    start = time.perf_counter()
    connection.send({"op": "probe", "seq": 0}, [payload])
    connection.recv()
    return payload.nbytes / max(time.perf_counter() - start, 1e-9)
