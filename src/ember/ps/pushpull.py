"""PushPull: a shard's pushes and pulls, held, folded (whole or streamed) and answered."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ember.errors import ProtocolError
from ember.ps.clocks import WorkerEntry
from ember.ps.coded import CodedExchanges
from ember.ps.compress import Squeeze, Views
from ember.ps.consistency import Consistency
from ember.ps.fold import Fold
from ember.ps.held import Held
from ember.ps.protocol import Answer, Exchange, Op
from ember.ps.replies import Replies
from ember.ps.shard import ALL_KEYS, SLICE, Shard
from ember.wire import Chunk, Request, SendTicket, ServerEndpoint


class PushPull(CodedExchanges):
    """Folds pushes into the shard and answers pushes and pulls when the consistency policy
    allows; a push that nothing can make wait is folded and answered chunk by chunk while
    the rest of it is still on the wire."""

    def __init__(
        self, shard: Shard, consistency: Consistency, endpoint: ServerEndpoint, replies: Replies
    ) -> None:
        self.shard, self.consistency = shard, consistency
        self.endpoint, self.replies = endpoint, replies
        self.clocks, self.rejected = shard.clocks, shard.rejected  # read often: named once
        self.held: list[Held] = []  # requests the policy does not allow to answer yet
        self.arriving: dict[bytes, Held] = {}  # peer -> push whose payload is on the wire
        self.fold = Fold(shard, replies)
        self.views = Views()  # of the workers that compress
        self.named_tau: int | None = None  # the period rank 0 named (diloco, --tau auto)

    @property
    def mid_update(self) -> bool:
        """Whether an update is half-applied: a push mid-stream, or folded into a round but
        not answered."""
        return any(h.streaming and h.worker.live for h in self.arriving.values()) or any(
            h.folded for h in self.held
        )

    def on_request(self, request: Request, exchange: Exchange) -> None:
        """A push or pull whose every field is checked (protocol.py), so nothing here can
        refuse it after it changed something."""
        worker = self._known_worker(exchange)
        seq = exchange.seq
        try:
            worker.check_seq(exchange.worker, seq)
        except ProtocolError:
            self.rejected["seq"] += 1
            raise
        if seq <= worker.last_seq:  # a repeated (worker, incarnation, seq): ack, never re-apply
            self._answer_duplicate(request, exchange, worker)
            return
        if exchange.op is Op.PUSH:
            self._check_payload(request, exchange)
        worker.last_seq = seq
        if exchange.tau is not None:
            # diloco's --tau auto: rank 0's push names the period for every worker, and every
            # reply of the round carries it. A BSP round's replies leave only once every
            # push of the round is in, rank 0's too, and before any push of the next, so all
            # workers read the same value from the same round.
            self.named_tau = exchange.tau
        if exchange.op is Op.PULL:
            self.held.append(Held(request, exchange, worker, None))
            self.drain()
            return
        held = Held(request, exchange, worker, [])
        self.arriving[request.peer] = held
        if self._can_stream(held):
            self._start_stream(held)

    def _answer_duplicate(self, request: Request, exchange: Exchange, worker: WorkerEntry) -> None:
        """A request sent again (its reply was lost with a failed server) is not applied
        twice, but gets a reply of the shape it expects: a read is safe to repeat, and an
        elastic difference it never received is answered as zero, a step it does not take."""
        self.shard.counters["duplicates"] += 1
        worker.answered_seq = max(worker.answered_seq, exchange.seq)
        answer = Answer(seq=exchange.seq, duplicate=True)
        coded = exchange.codec.compresses
        worker_id, peer = exchange.worker, request.peer
        if coded:  # a full-precision answer makes the view anew; a mirror it cannot
            self.views.release(worker_id)
            answer = replace(answer, view=False)
        if exchange.answers_params:
            if coded:
                params = self.shard.params
                self.views.reset(worker_id, worker.incarnation, peer, params)
                answer = replace(answer, view=True)
            ticket = self.endpoint.reply(request, answer.header(), [self.shard.params], track=True)
            if ticket is not None:
                self.replies.reading(ALL_KEYS, ticket)
        elif exchange.op is Op.PUSH and self.shard.rule.replies:
            zeros = self.replies.buffer()
            zeros.fill(0)
            ticket = self.endpoint.reply(request, answer.header(), [zeros], track=True)
            self.replies.recycle(zeros, ticket)
        else:
            self.endpoint.reply(request, answer.header())

    def _known_worker(self, exchange: Exchange) -> WorkerEntry:
        try:
            return self.clocks.known(exchange.worker, exchange.incarnation)
        except ProtocolError:
            self.rejected["incarnation"] += 1
            raise

    def _check_payload(self, request: Request, exchange: Exchange) -> None:
        """Refuse a push whose header does not fit this shard before any of its payload is used."""
        spec, codec = self.shard.spec, exchange.codec
        if exchange.keys != (spec.start, spec.stop):
            self.rejected["keys"] += 1
            keys = None if exchange.keys is None else list(exchange.keys)
            raise ProtocolError(
                f"push for keys {keys!r}, this shard holds [{spec.start}, {spec.stop}]"
            )
        table = request.header.get("tensors")
        wanted = ["float32", [spec.size]]  # EASGD's resync carries x_i in full
        if codec.compresses and not (self.shard.rule.replies and exchange.resync):
            wanted = ["uint8", [codec.encoded_size(spec.size)]]
        if table != [wanted]:
            self.rejected["shape"] += 1
            raise ProtocolError(
                f"push must carry one {wanted[0]} tensor of shape {wanted[1]}, got {table!r}"
            )

    # ---- streaming: a push folded chunk by chunk while the rest is still on the wire ----------
    def _can_stream(self, held: Held) -> bool:
        """Only when nothing can make this push wait: the policy answers it now (and its pull
        too), no earlier request of the worker is held, and no synchronous round collects it."""
        worker, slowest = held.worker, self.clocks.min_clock()
        pull = held.exchange.pull
        return (
            not held.exchange.codec.compresses  # an encoded push is decoded whole, then folded
            and not self.shard.synchronous
            and self.consistency.ready(worker.clock, slowest)
            and (not pull or self.consistency.ready(worker.clock + 1, slowest))
            and not any(h.worker is worker for h in self.held)
        )

    def _start_stream(self, held: Held) -> None:
        held.streaming = True
        if not (self.shard.rule.replies or held.exchange.pull):
            return  # a bare acknowledgement waits until every chunk is applied (_finish_stream)
        answer = self._reply_fields(held, clock=held.worker.clock + 1, step=self.shard.step + 1)
        table = [["float32", [self.shard.spec.size]]]
        self.endpoint.reply_header(held.request, answer.header(), table)
        if self.shard.rule.replies:
            # Through shared memory, the reply is computed where the worker will read it.
            in_place = self.endpoint.reply_view(held.request)
            held.reply = self.replies.buffer() if in_place is None else in_place
            held.pooled = in_place is None

    def on_chunk(self, chunk: Chunk) -> None:
        held = self.arriving.get(chunk.request.peer)
        if held is None or held.request is not chunk.request:
            return  # the push was refused at its header; its chunks are dropped
        if chunk.error is not None:
            raise ProtocolError(chunk.error)
        frame = chunk.request.frames[chunk.index]
        dtype = np.float32 if chunk.request.header["tensors"][0][0] == "float32" else np.uint8
        values = np.frombuffer(frame.buffer, dtype=dtype)
        if held.streaming:
            self._fold_streamed(held, values)
        else:
            assert held.payload is not None
            held.payload.append(values)
        if chunk.request.complete:
            del self.arriving[chunk.request.peer]
            if held.streaming:
                self._finish_stream(held)
            else:
                if held.exchange.codec.compresses:
                    held.payload = self._decoded(held)
                self.held.append(held)
                self.drain()

    def _fold_streamed(self, held: Held, values: np.ndarray) -> None:
        keys = slice(held.offset, held.offset + values.size)
        self.replies.release_for_writing(keys)  # another worker's reply may still read them
        out = None if held.reply is None else held.reply[keys]
        params = self.fold.chunk(keys, values, out)
        held.offset = keys.stop
        if out is not None:
            held.tickets.append(self.endpoint.reply_chunk(held.request, out))
        elif held.exchange.pull:
            ticket = self.endpoint.reply_chunk(held.request, params)
            self.replies.reading(keys, ticket)  # it reads the live parameters

    def _finish_stream(self, held: Held) -> None:
        worker, shard = held.worker, self.shard
        answered = held.reply is not None or held.exchange.pull
        ack = None if answered else self._reply_fields(held, worker.clock + 1, shard.step + 1)
        shard.commit_push(worker, held.exchange.step)
        worker.pulled_at = shard.step
        worker.answered_seq = held.exchange.seq
        self.shard.counters["replies"] += 1
        self.shard.counters["streamed"] += 1
        if held.reply is not None and held.pooled:
            self.replies.recycle(held.reply, SendTicket.joined(held.tickets))
        if ack is not None:
            self.endpoint.reply_header(held.request, ack.header(), None)
        self.drain()  # a worker that was waiting on this one's clock may now go on

    # ---- holding and answering -----------------------------------------------------------------
    def drain(self) -> None:
        """Serve every held request the policy now allows, until nothing changes."""
        progress = True
        while progress:
            progress = False
            for held in list(self.held):
                if self._try_serve(held):
                    self.held.remove(held)
                    progress = True

    def _try_serve(self, held: Held) -> bool:
        worker, exchange, shard = held.worker, held.exchange, self.shard
        if not worker.live:
            return True  # dropped while waiting: nobody to answer
        if held.payload is not None and not held.folded:
            if not self.consistency.ready(worker.clock, self.clocks.min_clock()):
                return False
            squeeze = None
            if held.exchange.codec.compresses and self.shard.rule.replies:
                squeeze = Squeeze(held.exchange.codec, self.shard.spec.size)
            refused = self.rejected["nonfinite"]
            reply = self.fold.payload(held.payload, worker, exchange.step, squeeze)
            held.folded = True
            self.fold.maybe_commit_round()
            if reply is not None and squeeze is not None:
                if self.rejected["nonfinite"] != refused:
                    squeeze.refused(reply, SLICE)
                self._answer_encoded(held, reply, squeeze.encoded)
                worker.pulled_at = shard.step
                return True
            if reply is not None:  # easgd: the elastic difference answers the push at once
                self._answer(held, reply_tensor=reply)
                worker.pulled_at = shard.step
                return True
        if exchange.answers_params:
            if not self.consistency.ready(worker.clock, self.clocks.min_clock()):
                return False
            if held.exchange.codec.compresses:
                self._answer_view(held)
            else:
                self._answer(held, reply_tensor=shard.params, aliases_params=True)
            worker.pulled_at = shard.step
        else:
            self._answer(held)
        return True

    def _answer(
        self,
        held: Held,
        reply_tensor: np.ndarray | None = None,
        aliases_params: bool = False,
        view: bool | None = None,
    ) -> None:
        answer = self._reply_fields(held, held.worker.clock, self.shard.step)
        if view is not None:
            answer = replace(answer, view=view)
        arrays = [reply_tensor] if reply_tensor is not None else []
        ticket = self.endpoint.reply(held.request, answer.header(), arrays, track=bool(arrays))
        held.worker.answered_seq = max(held.worker.answered_seq, answer.seq)
        if ticket is not None:
            if aliases_params:
                self.replies.reading(ALL_KEYS, ticket)
            elif reply_tensor is not None:
                self.replies.recycle(reply_tensor, ticket)
        self.shard.counters["replies"] += 1

    def _reply_fields(self, held: Held, clock: int, step: int) -> Answer:
        """The reply; staleness counts the updates others made since this worker's last
        read, as of the moment after its own push (`step`)."""
        pushed = held.payload is not None
        staleness = max(0, step - held.worker.pulled_at - 1) if pushed else 0
        return Answer(
            seq=held.exchange.seq, clock=clock, step=step, staleness=staleness, tau=self.named_tau
        )

    def forget_dead_streams(self) -> None:
        """A push whose worker died mid-stream (replaced by a new incarnation, or dropped for
        silence) will never complete: forget it, and the frames the endpoint kept for it."""
        for peer, held in list(self.arriving.items()):
            if not held.worker.live:
                del self.arriving[peer]
                self.endpoint.forget_stream(peer)

    def forget_views(self) -> None:
        """Views and mirrors of workers no longer live (done, dropped, pruned) are released."""
        if len(self.views):
            entries = self.clocks.entries.items()
            self.views.prune({w: e.incarnation for w, e in entries if e.live})

    def drop_silent_workers(self) -> None:
        if self.clocks.drop_silent({id(h.worker) for h in self.held}):
            self.forget_views()
            self.forget_dead_streams()
            self.fold.maybe_commit_round()
            self.drain()
