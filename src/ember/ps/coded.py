"""CodedExchanges: the part of PushPull that answers workers that compress (compress.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ember.errors import ProtocolError
from ember.ps.compress import Views, delta_reply
from ember.ps.held import Held
from ember.ps.protocol import Answer
from ember.ps.replies import Replies
from ember.ps.shard import SLICE, Shard
from ember.wire import ServerEndpoint


class CodedExchanges:
    """Decodes encoded pushes and sends encoded replies; PushPull holds the state it uses."""

    shard: Shard
    endpoint: ServerEndpoint
    replies: Replies
    views: Views

    def _answer(
        self,
        held: Held,
        reply_tensor: np.ndarray | None = None,
        aliases_params: bool = False,
        view: bool | None = None,
    ) -> None:
        raise NotImplementedError

    def _reply_fields(self, held: Held, clock: int, step: int) -> Answer:
        raise NotImplementedError

    def _decoded(self, held: Held) -> list[np.ndarray]:
        """An encoded push as float32 slices: gradients decoded, or EASGD's mirror of x_i
        moved by the decoded difference (made anew from x_i itself on a resync)."""
        assert held.payload is not None
        worker, peer, size = held.exchange.worker, held.request.peer, self.shard.spec.size
        data = np.concatenate(held.payload) if len(held.payload) > 1 else held.payload[0]
        if not self.shard.rule.replies:
            values = held.exchange.codec.decode(data, np.empty(size, np.float32))
        elif held.exchange.resync:
            values = self.views.reset(worker, held.worker.incarnation, peer, data)
        else:
            mirror = self.views.lookup(worker, held.worker.incarnation, peer)
            if mirror is None:
                self.shard.rejected["view"] += 1
                raise ProtocolError(
                    f"worker {worker} sent a difference, but this shard holds no "
                    "mirror of its parameters for this connection; resend with resync"
                )
            mirror += held.exchange.codec.decode(data, np.empty(size, np.float32))
            values = mirror
        return [values[start : start + SLICE] for start in range(0, values.size, SLICE)]

    def _answer_encoded(self, held: Held, reply: np.ndarray, encoded: np.ndarray) -> None:
        """EASGD's encoded elastic difference (already folded as decoded): the mirror moves
        by it as x_i will."""
        mirror = self.views.lookup(held.exchange.worker, held.worker.incarnation, held.request.peer)
        if mirror is not None:
            mirror -= reply
        self.replies.recycle(reply, None)  # nothing reads it: the encoding is its own array
        self._send_encoded(held, encoded, view=mirror is not None)

    def _answer_view(self, held: Held) -> None:
        """A pull in codec: the difference from the view this worker holds, or on a resync
        (or with no view yet) the parameters in full, which become its view."""
        worker_id, incarnation = held.exchange.worker, held.worker.incarnation
        params, peer = self.shard.params, held.request.peer
        view = None if held.exchange.resync else self.views.lookup(worker_id, incarnation, peer)
        if view is None:
            self.views.reset(worker_id, incarnation, peer, params)
            self._answer(held, reply_tensor=self.shard.params, aliases_params=True, view=True)
        else:
            self._send_encoded(held, delta_reply(held.exchange.codec, params, view), add=True)

    def _send_encoded(
        self, held: Held, encoded: np.ndarray, view: bool = True, add: bool = False
    ) -> None:
        answer = self._reply_fields(held, held.worker.clock, self.shard.step)
        answer = replace(answer, codec=held.exchange.codec.name, view=view, add=add)
        self.endpoint.reply(held.request, answer.header(), [encoded])
        held.worker.answered_seq = max(held.worker.answered_seq, answer.seq)
        self.shard.counters["replies"] += 1
        self.shard.counters["encoded_replies"] += 1
