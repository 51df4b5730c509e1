"""fetch_state and control: one request to every shard at once, outside any worker's
membership (checkpoints, the final model, stats and stop)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.errors import ProtocolError
from ember.ps.clockrows import COLUMNS, MAX_TABLE_ROWS, read_rows, rows_to_table
from ember.ps.protocol import Snapshot
from ember.wire import ClientConnection, gather, tensors_from_frames

CONNECT_TIMEOUT = 2.0  # per attempt at connecting to a shard


def fetch_state(
    addresses: list[str], secret: bytes, timeout: float = 60.0
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Gather every shard's parameters and rule state into full flat arrays (for checkpoints and
    the final model), plus step and per-worker clocks from shard 0."""
    connections = [
        ClientConnection(a, secret, timeout, watch=True, connect_timeout=CONNECT_TIMEOUT)
        for a in addresses
    ]
    try:
        for connection in connections:
            connection.send({"op": "snapshot", "seq": 0})
        parts = [connection.recv() for connection in connections]
    finally:
        for connection in connections:
            connection.close()
    snapshots = [Snapshot.from_header(h) for h, _ in parts]
    names = snapshots[0].names
    sizes = [_shard_size(h) for h, _ in parts]
    full = {name: np.empty(sum(sizes), dtype=np.float32) for name in names}
    offset = 0
    workers: dict[str, dict[str, int]] = {}
    for (header, frames), size in zip(parts, sizes, strict=True):
        # the shard's tensors, then its clock table (see clockrows.py)
        limit = 4 * size * len(names) + 8 * len(COLUMNS) * MAX_TABLE_ROWS
        *tensors, table = tensors_from_frames(header["tensors"], frames, max_bytes=limit)
        for name, chunks in zip(names, tensors, strict=True):
            gather(chunks, full[name][offset : offset + size])
        offset += size
        rows = read_rows(header["tensors"][-1], table, MAX_TABLE_ROWS)
        # Shards answer at slightly different moments; resuming from the least advanced clock
        # and step of each worker over all shards never skips work.
        for worker, entry in rows_to_table(rows).items():
            seen = workers.setdefault(worker, dict(entry))
            seen["clock"] = min(seen["clock"], entry["clock"])
            seen["step"] = min(seen["step"], entry["step"])
    meta: dict[str, Any] = {"step": min(s.step for s in snapshots), "workers": workers}
    if "pieces" in parts[0][0]:  # a worker range's data cursor, shard 0's (ps/pieces.py)
        meta["pieces"] = parts[0][0]["pieces"]
    return full, meta


def control(
    addresses: list[str],
    secret: bytes,
    op: str,
    timeout: float = 10.0,
    fields: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Send a payload-free op (`stats`, `stop`, `promote`) to every shard; return their reply
    headers."""
    out = []
    for address in addresses:
        connection = ClientConnection(
            address, secret, timeout, watch=True, connect_timeout=min(CONNECT_TIMEOUT, timeout)
        )
        try:
            connection.send({"op": op, "seq": 0, **(fields or {})})
            out.append(connection.recv()[0])
        finally:
            connection.close()
    return out


def _shard_size(header: dict[str, Any]) -> int:
    table = header.get("tensors")
    if not isinstance(table, list) or not table or not isinstance(table[0], list):
        raise ProtocolError("snapshot reply carries no tensor table")
    return int(table[0][1][0])
