"""PSClient: a worker's push/pull view of all server shards (one connection per shard)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ember.errors import NotPrimary, ProtocolError, ServerGone, ServerUnavailable
from ember.ps.codec import IDENTITY, Codec, codec_named
from ember.ps.compress import ShardLink
from ember.ps.protocol import (
    OPS,
    Answer,
    Done,
    Exchange,
    Joined,
    Op,
    Register,
    WorkerRequest,
)
from ember.wire import (
    ClientConnection,
    LaneChoice,
    gather,
    probe,
    shared,
    tensors_from_frames,
    wire_lanes,
)

CONNECT_TIMEOUT = 2.0  # per attempt while a shard fails over or restarts
PROBED_LANES = 4  # the most lanes "auto" tries (lanes.py)
BACKOFF = (0.05, 1.0)  # first and longest pause between attempts


@dataclass
class ExchangeResult:
    seconds: float  # wall time of the whole exchange, all shards
    bytes_pushed: int
    bytes_pulled: int
    staleness: int  # largest, over shards, of server updates between this worker's read and write
    tau: int | None = None  # the period the servers' round names (diloco's --tau auto), if any
    lanes: int = 1  # the most sockets a shard's payloads were striped over (wire/lanes.py)


class PSClient:
    """Push, pull and exchange against S shards. Requests go to every shard before any reply is
    awaited, so shards work in parallel. Not thread-safe: one thread owns a client.

    Each address may list a shard's replicas, comma-separated. When a shard's process dies
    the client re-sends the request in flight to whichever replica serves as primary (or to
    the restarted process at the same address), with bounded back-off, until `timeout`.

    With `compress` (a Codec of codec.py, or its name) payloads and replies travel encoded, as
    compress.py describes: `differences` says the pushes carry parameters (EASGD), not
    gradients.
    """

    def __init__(
        self,
        addresses: list[str],
        secret: bytes,
        *,
        worker: int,
        incarnation: int = 0,
        timeout: float = 60.0,
        compress: Codec | str = "none",
        differences: bool = False,
    ) -> None:
        codec = compress if isinstance(compress, Codec) else codec_named(compress)
        self.worker, self.incarnation, self.timeout = worker, incarnation, timeout
        self.codec, self.differences = codec, differences
        self.links: list[ShardLink] | None = None  # per shard, when compressing
        self._originals: list[np.ndarray | None] = []  # the push in flight, uncompressed
        self._secret = secret
        self.candidates = [a.split(",") for a in addresses]
        self._current = [0] * len(addresses)  # which replica of each shard we talk to
        self.failovers = 0
        self.lanes: dict[int, LaneChoice] = {}  # shard -> what its probe chose (--wire-lanes auto)
        self.connections = [
            ClientConnection(c[0], secret, timeout, watch=True) if len(c) == 1 else self._open(i)
            for i, c in enumerate(self.candidates)
        ]
        self.seq = 0
        self.clock = 0
        self.step = 0  # the caller's local step, sent along as the resume point
        self.run_step = 0  # where the run's schedule stood at the last registration
        self.tau: int | None = None  # a period to name with every push (diloco's rank 0, auto)
        self.ranges: list[tuple[int, int]] = []

    def register(self) -> dict[str, int]:
        """Join every shard; returns the clock and step the servers remember for this worker."""
        replies = self._round_trip("register", [None] * len(self.connections), {})
        joined = [Joined.from_header(h) for h, _ in replies]
        self.ranges = [j.keys for j in joined]
        if self.codec.name != "none":  # a new membership: every view starts in full precision
            self.links = [ShardLink(self.codec, b - a, self.differences) for a, b in self.ranges]
        for index in range(len(self.connections)):
            self._share_memory(index)
            self._stripe(index)
        self.clock = min(j.clock for j in joined)
        self.step = min(j.step for j in joined)
        self.run_step = max(j.run_step for j in joined)  # shards answer at moments apart
        return {"clock": self.clock, "step": self.step, "run_step": self.run_step}

    @property
    def lane_count(self) -> int:
        return max(c.lane_count for c in self.connections)

    @property
    def size(self) -> int:
        return self.ranges[-1][1] if self.ranges else 0

    def shared_buffers(self) -> tuple[np.ndarray, np.ndarray] | None:
        """With one shard whose payloads go through shared memory: (request, reply) arrays of
        all parameters that lie in its region. Values written into the first are pushed with
        no copy; a reply into the second arrives with none, and stays there until the next
        request. None when the payloads travel some other way (several shards, a socket, or
        encoded: the region then carries the encoded bytes, as the socket would)."""
        if len(self.connections) != 1 or not self.ranges or self.links is not None:
            return None
        return self.connections[0].payload_views(self.size)

    def push(
        self, values: np.ndarray, reply_into: np.ndarray | None = None, pull: bool = False
    ) -> ExchangeResult:
        """Push `values` (flat float32, all keys); if `reply_into` is given, write each shard's
        reply there (parameters when `pull`, easgd's elastic difference otherwise).

        `values` is sent zero-copy: the caller must not modify it until this call returns.
        """
        started = time.perf_counter()
        originals = [values[a:b] for a, b in self.ranges]
        parts: list[np.ndarray | None] = list(originals)
        if self.links is not None:
            parts = [link.outgoing(v) for link, v in zip(self.links, originals, strict=True)]
        self._originals = list(originals)
        into = None if reply_into is None else [reply_into[a:b] for a, b in self.ranges]
        replies = self._round_trip("push", parts, {"pull": True} if pull else {}, into)
        self.clock += 1
        answers = [Answer.from_header(h) for h, _ in replies]
        pulled = self._scatter(replies, answers, reply_into, push=True)
        self._originals = []
        return ExchangeResult(
            time.perf_counter() - started,
            sum(p.nbytes for p in parts if p is not None),
            pulled,
            max(a.staleness for a in answers),
            answers[0].tau,
            self.lane_count,
        )

    def pull(self, out: np.ndarray) -> ExchangeResult:
        started = time.perf_counter()
        into = [out[a:b] for a, b in self.ranges]
        self._originals = [None] * len(self.connections)
        replies = self._round_trip("pull", [None] * len(self.connections), {}, into)
        # a compressed pull's replies say how to apply them; a plain one's carry values
        answers = None if self.links is None else [Answer.from_header(h) for h, _ in replies]
        pulled = self._scatter(replies, answers, out, push=False)
        return ExchangeResult(time.perf_counter() - started, 0, pulled, 0, lanes=self.lane_count)

    def done(self) -> None:
        """Leave the clock table so synchronous peers stop waiting for this worker."""
        self._round_trip("done", [None] * len(self.connections), {})

    def close(self) -> None:
        for connection in self.connections:
            connection.close()

    def _round_trip(
        self,
        op: str,
        parts: list[np.ndarray | None],
        extra: dict[str, Any],
        into: list[np.ndarray] | None = None,
    ) -> list[tuple[dict[str, Any], list[Any]]]:
        """Send to every shard, then collect the replies; with `into`, shard i's reply lands
        in into[i] as it arrives (_scatter then finds it in place)."""
        self.seq += 1
        for index, (connection, part) in enumerate(zip(self.connections, parts, strict=True)):
            header = self._message(op, index, part, extra).header()
            connection.send(header, [part] if part is not None else [])
        replies = []
        for index, part in enumerate(parts):
            connection = self.connections[index]
            try:
                header, frames = connection.recv(into=None if into is None else into[index])
            except (ServerGone, NotPrimary):
                header, frames = self._recover(index, op, part, extra)
                connection = self.connections[index]
            if header.get("seq", self.seq) != self.seq:
                raise ProtocolError(
                    f"server at {connection.address} answered request "
                    f"{header.get('seq')}, expected {self.seq}"
                )
            replies.append((header, frames))
        return replies

    def _message(
        self, op: str, index: int, part: np.ndarray | None, extra: dict[str, Any]
    ) -> WorkerRequest:
        """Shard `index`'s request of this round trip; `extra` sets fields of it."""
        worker, incarnation, seq = self.worker, self.incarnation, self.seq
        message: WorkerRequest
        if op == Op.REGISTER:
            message = Register(worker=worker, incarnation=incarnation, seq=seq)
        elif op == Op.DONE:
            message = Done(worker=worker, incarnation=incarnation, seq=seq)
        else:
            # EASGD's pull (its start at the center) is full precision; its pushes are encoded.
            coded = op == Op.PUSH or not self.differences
            link = self.links[index] if self.links is not None and coded else None
            message = Exchange(
                op=OPS[op],
                worker=worker,
                incarnation=incarnation,
                seq=seq,
                step=self.step,
                keys=self.ranges[index] if part is not None else None,
                tau=self.tau if op == Op.PUSH else None,
                codec=IDENTITY if link is None else link.codec,
                resync=link is not None and not link.synced,
            )
        return replace(message, **extra) if extra else message

    def _recover(
        self, index: int, op: str, part: np.ndarray | None, extra: dict[str, Any]
    ) -> tuple[dict[str, Any], list[Any]]:
        """Shard `index` died or handed over: rejoin whichever replica now serves it and send
        the request again (the server's sequence check keeps it from being applied twice)."""
        backoff = _Backoff(self.timeout, f"shard {index} ({', '.join(self.candidates[index])})")
        if self.links is not None and op in ("push", "pull"):  # the reply may be lost: resync
            part = self.links[index].resend(self._originals[index])
        while True:
            self.connections[index].close()
            self._next_replica(index)
            self.connections[index] = connection = self._open(index, backoff)
            try:
                if op not in ("register", "done"):  # done needs no membership: it ends it
                    connection.send(self._message("register", index, None, {}).header())
                    connection.recv()
                    self._share_memory(index)
                    self._stripe(index)
                connection.send(
                    self._message(op, index, part, extra).header(),
                    [part] if part is not None else [],
                )
                reply = connection.recv()
                self.failovers += 1
                return reply
            except (ServerGone, NotPrimary) as exc:
                backoff.pause_or_raise(exc)

    def _share_memory(self, index: int) -> None:
        """On the shard's host, payloads go through shared memory (see wire/shared.py)."""
        if shared.enabled():
            start, stop = self.ranges[index]
            self.connections[index].share_memory(4 * (stop - start), owner=self.worker)

    def _stripe(self, index: int) -> None:
        """Off shared memory, the shard's payloads go over as many sockets as --wire-lanes
        says, or its probe chose (once per shard: a reconnection keeps the choice)."""
        connection, setting = self.connections[index], wire_lanes()
        if connection.shared:
            return
        if setting != "auto":
            connection.set_lanes(int(setting))
        elif index in self.lanes:
            connection.set_lanes(self.lanes[index].lanes)
        else:
            self.lanes[index] = choice = probe(connection, PROBED_LANES)
            note = f"ember: worker {self.worker}, shard {index}: {choice.describe()}"
            print(note, file=sys.stderr, flush=True)  # the worker's log

    def _open(self, index: int, backoff: _Backoff | None = None) -> ClientConnection:
        """Connect to the shard's current replica, trying the others in turn."""
        backoff = backoff or _Backoff(self.timeout, f"shard {index}")
        while True:
            address = self.candidates[index][self._current[index]]
            try:
                return ClientConnection(
                    address,
                    self._secret,
                    self.timeout,
                    watch=True,
                    connect_timeout=min(CONNECT_TIMEOUT, self.timeout),
                )
            except ServerUnavailable as exc:
                backoff.pause_or_raise(exc)
            self._next_replica(index)

    def _next_replica(self, index: int) -> None:
        self._current[index] = (self._current[index] + 1) % len(self.candidates[index])

    def _scatter(
        self,
        replies: list[tuple[dict[str, Any], list[Any]]],
        answers: list[Answer] | None,
        out: np.ndarray | None,
        push: bool,
    ) -> int:
        """Each shard's reply tensor into `out`; `answers` are read where the client compresses."""
        if out is None:
            return 0
        received = 0
        for index, ((a, b), (header, frames)) in enumerate(zip(self.ranges, replies, strict=True)):
            if self.links is not None:
                answer, table = (answers or [])[index], header.get("tensors", [])
                received += self.links[index].incoming(answer, table, frames, out[a:b], push)
                continue
            chunks = tensors_from_frames(header.get("tensors", []), frames, max_bytes=4 * (b - a))
            if len(chunks) != 1:
                raise ProtocolError(f"expected one tensor in the reply for keys [{a}, {b}]")
            gather(chunks[0], out[a:b])
            received += 4 * (b - a)
        return received


class _Backoff:
    """Pauses between attempts to reach a shard, doubling up to a limit, until a deadline."""

    def __init__(self, timeout: float, what: str) -> None:
        self.deadline, self.timeout, self.what = time.monotonic() + timeout, timeout, what
        self.pause = BACKOFF[0]

    def pause_or_raise(self, error: Exception) -> None:
        if time.monotonic() + self.pause > self.deadline:
            raise ServerUnavailable(
                f"{self.what} did not come back within {self.timeout:g}s: {error}"
            ) from None
        time.sleep(self.pause)
        self.pause = min(2 * self.pause, BACKOFF[1])
