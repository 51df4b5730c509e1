"""ParameterServer: one contiguous key range of the flat parameters, with an injected rule."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ember.errors import ProtocolError
from ember.ps.clocks import ClockTable
from ember.ps.consistency import Asynchronous, Consistency
from ember.ps.piece_protocol import Dealt, Take
from ember.ps.pieces import Cursor, Geometry, PieceQueue, parse_cursor
from ember.ps.protocol import (
    PRIMARY_OPS,
    WORKER_OPS,
    Done,
    Exchange,
    FieldError,
    Joined,
    Op,
    Register,
    Snapshot,
    worker_request,
)
from ember.ps.pushpull import PushPull
from ember.ps.replica import Replication, Role
from ember.ps.replies import Replies, unread_budget
from ember.ps.shard import ALL_KEYS, Shard, ShardSpec, UpdateRule, shard_ranges
from ember.wire import Chunk, Request, ServerEndpoint

__all__ = ["Op", "ParameterServer", "Role", "ShardSpec", "UpdateRule", "shard_ranges"]

MAX_ERROR_CHARS = 1000
MIN_REGION_BYTES = 1 << 16  # what a tiny shard's region may hold each way all the same
# a snapshot's data cursor, in its header: bits of the open epochs' pieces, base64 (a larger
# one, 190,000 pieces an epoch or more, is not checkpointed: a resume deals its epoch anew)
MAX_CURSOR_CHARS = 32 << 10


class ParameterServer:
    """A store with an injected update rule; the consistency policy decides when to answer.

    The server is a loop over requests and a table from operation to handler; the Shard
    holds the state, and its pushes and pulls (PushPull), the buffers its replies read
    (Replies) and its replication (Replication) are parts it hands the Shard to, as ps-lite's
    KVServer hands its request handle the store."""

    def __init__(
        self,
        shard: ShardSpec,
        params: np.ndarray,
        rule: UpdateRule,
        consistency: Consistency,
        secret: bytes,
        *,
        bind: str = "tcp://127.0.0.1:0",
        state: dict[str, np.ndarray] | None = None,
        expected_workers: int = 0,
        workers: dict[int, dict[str, int]] | None = None,
        step: int = 0,
        worker_timeout: float = 30.0,
        role: str = Role.PRIMARY,
        backup: str | None = None,
        replica_seconds: float = 0.25,
        max_workers: int | None = None,
        members_max: int | None = None,
        cursor: Cursor | None = None,
    ) -> None:
        """A `backup` server only takes copies from its primary until it is promoted; a
        primary with a `backup` address ships it a copy of its state every replica_seconds.
        At most `max_workers` workers are registered at once (default: a few times the
        expected ones, plus room for joiners); under a worker range, `members_max` at most are
        live."""
        self.spec, self.rule, self.consistency = shard, rule, consistency
        # Slow process start-up (spawn, imports, data) must not count as silence.
        self.clocks = ClockTable(
            expected_workers,
            workers,
            worker_timeout,
            startup_grace=max(120.0, worker_timeout),
            max_workers=max_workers,
            members_max=members_max,
        )
        self.shard = Shard(
            shard,
            params,
            rule,
            self.clocks,
            synchronous=consistency.synchronous,
            saved=state,
            step=step,
        )
        # Only a push and a copy from the primary carry a payload, each refused at its header
        # unless it has the shard's exact shape (pushpull.py, replica.py): the endpoint
        # refuses one of any other request. A region carries a push (or its reply) at most.
        self.endpoint = ServerEndpoint(
            secret,
            bind,
            max_unread_bytes=unread_budget(shard, rule.state_names),
            payload_ops=(Op.PUSH, Op.REPLICATE),
            max_region_bytes=max(4 * shard.size, MIN_REGION_BYTES),
        )
        self.address = self.endpoint.address
        self.counters, self.rejected = self.shard.counters, self.shard.rejected
        self.replies = Replies(self.shard)
        self.pushes = PushPull(self.shard, consistency, self.endpoint, self.replies)
        self.replication = Replication(
            self.shard,
            self.endpoint,
            self.replies,
            secret,
            role=Role(role),
            backup=backup,
            interval=replica_seconds,
            cursor=self._bounded_cursor,
        )
        self._running = True
        self._handlers: dict[str, Callable[[Request], None]] = {
            **dict.fromkeys(WORKER_OPS, self._worker_request),
            Op.SNAPSHOT: self._snapshot,
            Op.STATS: self._stats,
            Op.STOP: self._stop,
            Op.REPLICATE: self.replication.accept_copy,
            Op.PROMOTE: self.replication.promote,
            Op.PIECE: self._piece,
        }
        self.pieces: PieceQueue | None = None  # a worker range's data cursor, on first use
        self._saved_cursor = cursor  # a resumed run's, taken by a queue of the same cut
        self._lease_seconds = worker_timeout
        self._expired_at = 0.0
        self._below_since: float | None = None  # since when fewer than MIN members are in

    # ---- what tests and tools read of the shard ------------------------------------------------
    @property
    def params(self) -> np.ndarray:
        return self.shard.params

    @property
    def state(self) -> dict[str, np.ndarray]:
        return self.shard.rule_state

    @property
    def step(self) -> int:
        return self.shard.step

    @property
    def role(self) -> Role:
        return self.replication.role

    # ---- the loop ------------------------------------------------------------------------------
    def serve(self) -> None:
        """Serve until a `stop` request; checks for silent workers between requests."""
        while self._running:
            event = self.endpoint.poll(timeout=0.2)
            request = event.request if isinstance(event, Chunk) else event
            if request is not None:
                try:
                    if isinstance(event, Chunk):
                        self._on_chunk(event)
                    else:
                        self._handle(request)
                except ProtocolError as exc:
                    self.rejected["request"] += 1
                    if isinstance(exc, FieldError):  # the fields are the protocol's: bounded
                        self.rejected[exc.field] += 1
                    self.pushes.arriving.pop(request.peer, None)
                    # the reason may quote the bad value: bounded, so the reply always seals
                    message = str(exc)[:MAX_ERROR_CHARS]
                    self.endpoint.reply(request, {"op": "error", "message": message})
            if self.role is Role.PRIMARY:  # a backup hears from nobody; its copies say who is live
                self.pushes.drop_silent_workers()
                self._expire_pieces()
            if self.replication.copy_due and not self.pushes.mid_update:
                self.replication.send_copy()
        self.replication.close()
        self.endpoint.close()

    def _handle(self, request: Request) -> None:
        op = request.header["op"]
        handler = self._handlers.get(op)
        if handler is None:
            raise ProtocolError(f"unknown op {op!r}")
        if op in PRIMARY_OPS and self.role is not Role.PRIMARY:
            self.counters["not_primary"] += 1
            message = f"shard {self.spec.index} at {self.address} is a backup"
            self.endpoint.reply(request, {"op": "error", "not_primary": True, "message": message})
            return
        handler(request)

    def _worker_request(self, request: Request) -> None:
        """A connection speaks for the one worker it registered (or first named): a request
        for another worker is refused, as is one for a worker another connection holds,
        except a registration, which is how a worker's new incarnation takes over its id."""
        message = worker_request(request.header)
        takes_over = isinstance(message, Register)
        refused = self.endpoint.identities.claim(request.peer, message.worker, takes_over)
        if refused is not None:
            self.rejected["identity"] += 1
            op = request.header["op"]
            raise ProtocolError(f"{op} for worker {message.worker} refused: {refused}")
        match message:
            case Register():
                self._register(request, message)
            case Exchange():
                self.pushes.on_request(request, message)
            case Done():
                self._done(request, message)

    def _on_chunk(self, chunk: Chunk) -> None:
        if chunk.request.header.get("op") == Op.REPLICATE:
            self.replication.on_chunk(chunk)
        else:
            self.pushes.on_chunk(chunk)

    # ---- handlers ------------------------------------------------------------------------------
    def _register(self, request: Request, message: Register) -> None:
        worker, seq, incarnation = message.worker, message.seq, message.incarnation
        known = self.clocks.entries.get(worker)
        if known is not None and known.incarnation == incarnation and known.last_seq >= 0:
            try:  # the same incarnation again: its numbers go on from where they were
                known.check_seq(worker, seq)
            except ProtocolError:
                self.rejected["seq"] += 1
                raise
        try:
            entry = self.clocks.register(worker, incarnation, self.shard.step)
        except ProtocolError:
            self.rejected["register"] += 1
            raise
        # A registration anchors the incarnation's window (a new one starts fresh, at -1): a
        # server restarted from a checkpoint, which holds no numbers, takes the worker's own.
        # The request a failover resends carries the register's number, so it still applies.
        entry.last_seq = max(entry.last_seq, seq - 1)
        if self.pieces is not None:  # an earlier incarnation died with what it held
            self.pieces.lost(worker, older_than=incarnation)
        keys = (self.spec.start, self.spec.stop)
        run_step = self.clocks.run_step()
        joined = Joined(clock=entry.clock, step=entry.step, keys=keys, run_step=run_step)
        self.endpoint.reply(request, joined.header())
        self.pushes.forget_dead_streams()
        self.pushes.forget_views()  # an older incarnation's
        self.pushes.drain()

    def _done(self, request: Request, message: Done) -> None:
        """`done` is idempotent: a worker re-sending it after a failover, to a backup whose
        copy already saw it leave (or never saw it join), has nothing more to do."""
        worker = message.worker
        entry = self.clocks.entries.get(worker)
        if entry is not None and entry.incarnation == message.incarnation:
            if self.pieces is not None:
                self.pieces.leave(worker, message.incarnation)
            self.clocks.finish(worker)
            self.pushes.views.release(worker)
        self.endpoint.identities.release(request.peer)  # the connection may join as another
        self.endpoint.reply(request, {"op": "ok"})
        self.pushes.fold.maybe_commit_round()  # the leaver may have been the last a round awaited
        self.pushes.drain()

    def _piece(self, request: Request) -> None:
        """A member's word on its pieces of the data (pieces.py); the queue is made by the
        first, and every later request must name the same cut of the rows."""
        message = Take.from_header(request.header)
        if self.pieces is None:
            # only a run whose members never wait on each other may have one wait for pieces
            waits = isinstance(self.consistency, Asynchronous)
            self.pieces = PieceQueue(message.geometry, self._lease_seconds, waits)
            self.pieces.steps_of = self._steps_folded
            saved = self._promoted_cursor()
            if saved is not None and saved.geometry == message.geometry:
                self.pieces.restore(saved)
            elif saved is not None:  # other data, or another batch size: every piece anew
                event = {"event": "cursor not resumed", "saved": _cut(saved.geometry)}
                self.clocks.events.append(event)
        queue = self.pieces
        if message.geometry != queue.geometry:
            self.rejected["cut"] += 1
            raise ProtocolError(
                f"worker {message.worker} cuts the data as {_cut(message.geometry)}; the run's "
                f"pieces are {_cut(queue.geometry)} (is it reading other data?)"
            )
        worker, incarnation = message.worker, message.incarnation
        queue.renew(worker, incarnation)
        entry = self.clocks.entries.get(worker)
        if entry is not None and entry.live and entry.incarnation == incarnation:
            entry.last_seen = time.monotonic()  # one waiting for rows is not silent
        if message.finished is not None:
            queue.finish(worker, incarnation, message.finished)
        if message.returned is not None:
            queue.give_back(worker, incarnation, message.returned, message.step)
        if message.started is not None:
            queue.start(worker, incarnation, message.started, message.step, message.batch)
        hold = message.take and self._below_min()
        dealt = queue.take(worker, incarnation, message.epoch, hold) if message.take else None
        reply = Dealt(
            seq=message.seq,
            piece=dealt if isinstance(dealt, tuple) else None,
            wait=dealt == "wait",
        )
        self.endpoint.reply(request, reply.header())

    def _steps_folded(self, worker: int) -> int | None:
        """The worker's own step at its last push this server folded (its clock entry's)."""
        entry = self.clocks.entries.get(worker)
        return entry.step if entry is not None else None

    def _bounded_cursor(self) -> dict[str, Any] | None:
        """The data cursor for a checkpoint or a backup's copy, if there is one that fits a
        header."""
        cursor = self.pieces.cursor() if self.pieces is not None else None
        if cursor is None or sum(map(len, cursor["done"].values())) > MAX_CURSOR_CHARS:
            return None
        return cursor

    def _promoted_cursor(self) -> Cursor | None:
        """The cursor a promoted backup deals from: its primary's last copy's, checked; a bad
        one is counted and dropped (every piece of its epochs is dealt anew)."""
        copied = self.replication.cursor_copy
        if copied is None:
            return self._saved_cursor
        try:
            return parse_cursor(copied)
        except ValueError:
            self.rejected["cursor"] += 1
            return self._saved_cursor

    def _below_min(self) -> bool:
        """Whether members ask for rows while fewer than the range's MIN are in, some lost
        (dropped as silent, not left): they wait for others (a restart, a joiner) up to the
        worker timeout, then go on with whoever is there, so that a range never fails for
        lack of members. One that left was asked to, or ran out of rows: nobody waits."""
        entries = self.clocks.entries.values()
        present = sum((e.live or e.finished) and e.incarnation >= 0 for e in entries)
        if present >= self.clocks.expected:
            self._below_since = None
            return False
        now = time.monotonic()
        self._below_since = self._below_since or now
        return now - self._below_since < self._lease_seconds

    def _expire_pieces(self) -> None:
        """Twice a second: pieces of members the clock table dropped as silent, or whose
        lease ran out, go back to the queue."""
        if self.pieces is None or time.monotonic() - self._expired_at < 0.5:
            return
        self._expired_at = time.monotonic()
        for worker, entry in self.clocks.entries.items():
            if not entry.live and not entry.finished and entry.incarnation >= 0:
                self.pieces.lost(worker, older_than=entry.incarnation + 1)
        self.pieces.expire()

    def _snapshot(self, request: Request) -> None:
        """The shard's tensors, then its clock table as the last payload tensor (see
        clockrows.COLUMNS): a table of any size fits a payload, not a header."""
        tensors = self.shard.saved()
        header = Snapshot(names=tuple(tensors), step=self.shard.step).header()
        cursor = self._bounded_cursor()
        if cursor is not None:
            header["pieces"] = cursor
        arrays = [*tensors.values(), self.clocks.rows(resume_only=True)]
        ticket = self.endpoint.reply(request, header, arrays, track=True)
        if ticket is not None:
            self.replies.reading(ALL_KEYS, ticket)

    def _stats(self, request: Request) -> None:
        self.endpoint.reply(request, {"op": "ok", **self.stats()})

    def _stop(self, request: Request) -> None:
        self.endpoint.reply(request, {"op": "ok", **self.stats()})
        self._running = False

    def stats(self) -> dict[str, Any]:
        return {
            "shard": self.spec.index,
            "role": self.role.value,
            "replication": self.replication.stats(),
            "step": self.shard.step,
            "counters": dict(self.counters),
            "rejected": dict(self.rejected + self.endpoint.rejected),
            "events": list(self.clocks.events),
            "workers": self.clocks.summary(),
            "live_workers": self.clocks.live_sample(),  # the lowest ids only: bounded
            "shared_memory": self.endpoint.shared_memory,
            "striping": self.endpoint.lanes.usage(),
            "encrypted": self.endpoint.encrypted,
            **({"pieces": self.pieces.stats()} if self.pieces is not None else {}),
        }


def _cut(geometry: Geometry) -> str:
    return f"{geometry.rows} rows in pieces of {geometry.piece_rows}, {geometry.epochs} epochs"
