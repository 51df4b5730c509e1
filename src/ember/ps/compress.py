"""Compressed exchanges: what a worker keeps per shard, and what a server keeps per worker.

Gradients (sgd): the worker sends Q(g + r) and keeps the residual r = g + r - decode(Q(g + r)),
so what rounding drops is sent later and the sum over time is exact. Pulled parameters: the
server keeps, per worker, the view of the parameters that worker holds, replies
Q(params - view) and adds the decoded reply to the view, as the worker adds it to its
parameters; the next pull carries whatever this one rounded away.

EASGD: both sides keep the server's mirror of x_i. The worker sends Q(x_i - mirror) and both
add its decoding to the mirror; the server answers Q(e), e = alpha * (mirror - center), and
applies decode(Q(e)) to the center (+) and the mirror (-), the worker to x_i (-).

Views and mirrors are made by a full-precision exchange (`resync`): a worker's first, and any
after a retry, a reconnect or a new incarnation, so a reply the worker never applied cannot
leave the two sides apart. A reply says with `view` whether the server now holds this
connection's view; a worker that is not told so asks for a resync next time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ember.errors import ProtocolError
from ember.ps.codec import Codec
from ember.ps.protocol import Answer
from ember.wire import gather, tensors_from_frames


class ShardLink:
    """A worker's compression state towards one shard of `size` keys. `differences`: the
    payload is parameters (EASGD's x_i), sent as differences from the mirror; otherwise it
    is gradients, sent with error feedback."""

    def __init__(self, codec: Codec, size: int, differences: bool) -> None:
        self.codec, self.size, self.differences = codec, size, differences
        self.residual = np.zeros(0 if differences else size, np.float32)
        self.mirror = np.zeros(size if differences else 0, np.float32)
        self.synced = False  # the server holds this connection's view or mirror
        self._scratch = np.empty(size, np.float32)
        self._sent: np.ndarray | None = None  # the last payload, for a resend

    def outgoing(self, values: np.ndarray) -> np.ndarray:
        """What to send for `values` (this shard's keys)."""
        scratch, codec = self._scratch, self.codec
        if not self.differences:
            np.add(values, self.residual, out=scratch)  # what the worker means to send
            sent = codec.encode(scratch)
            np.subtract(scratch, codec.decode(sent, self.residual), out=self.residual)
            if not np.isfinite(self.residual.sum()):  # NaN or Inf, which the server refuses,
                self.residual[...] = 0  # is not carried on to poison every later push
            self._sent = sent
            return sent
        if self.synced:
            np.subtract(values, self.mirror, out=scratch)
            self.synced = bool(np.isfinite(scratch.sum()))  # else sent in full, as on a resync
        if not self.synced:
            self.mirror[...] = values
            sent = values
        else:
            sent = codec.encode(scratch)
            self.mirror += codec.decode(sent, scratch)
        self._sent = sent
        return sent

    def resend(self, values: np.ndarray | None) -> np.ndarray | None:
        """The payload to send again after a failover: gradients as they were encoded (the
        residual already holds what they dropped), parameters in full precision."""
        self.synced = False
        if values is None or not self.differences:
            return self._sent if values is not None else None
        self.mirror[...] = values
        return values

    def incoming(
        self, answer: Answer, table: Any, frames: list[Any], out: np.ndarray, push: bool
    ) -> int:
        """Apply a reply's tensor (its wire `table` and `frames`) to `out` (this shard's
        keys); returns its bytes."""
        limit = 4 * self.size
        chunks = tensors_from_frames(table, frames, max_bytes=limit)
        if len(chunks) != 1:
            raise ProtocolError(f"expected one tensor in a reply for {self.size} keys")
        coded = answer.codec
        if coded is None:
            gather(chunks[0], out)
        else:
            speaks = self.codec.name
            if coded != speaks:
                raise ProtocolError(f"reply in codec {coded!r}, this worker speaks {speaks!r}")
            data = chunks[0][0] if len(chunks[0]) == 1 else np.concatenate(chunks[0])
            decoded = self.codec.decode(data, self._scratch)
            if answer.add:
                out += decoded
            else:
                out[...] = decoded
        if self.differences and push:
            self.mirror -= out  # the elastic difference moves the mirror as it moves x_i
        if answer.view is not None:
            self.synced = answer.view
        return sum(c.nbytes for c in chunks[0])


@dataclass
class View:
    incarnation: int
    peer: bytes
    values: np.ndarray  # float32, the shard's keys as this worker holds them


class Views:
    """A server's per-worker views (sgd) or mirrors (EASGD) of one shard, for the workers
    that compress; each is a copy of the shard, released when its worker leaves."""

    def __init__(self) -> None:
        self._views: dict[int, View] = {}

    def __len__(self) -> int:
        return len(self._views)

    def lookup(self, worker: int, incarnation: int, peer: bytes) -> np.ndarray | None:
        view = self._views.get(worker)
        if view is None or view.incarnation != incarnation or view.peer != peer:
            return None
        return view.values

    def reset(self, worker: int, incarnation: int, peer: bytes, values: np.ndarray) -> np.ndarray:
        """The view of a full-precision exchange: a copy of `values`."""
        copy = np.array(values, dtype=np.float32, copy=True).reshape(-1)
        self._views[worker] = View(incarnation, peer, copy)
        return copy

    def release(self, worker: int) -> None:
        self._views.pop(worker, None)

    def prune(self, live: dict[int, int]) -> None:
        """Keep only the views of live workers (worker -> incarnation)."""
        for worker, view in list(self._views.items()):
            if live.get(worker) != view.incarnation:
                del self._views[worker]


def delta_reply(codec: Codec, params: np.ndarray, view: np.ndarray) -> np.ndarray:
    """Q(params - view), with its decoding added to the view as the worker will add it."""
    delta = np.subtract(params, view)
    sent = codec.encode(delta)
    view += codec.decode(sent, delta)
    return sent


class Squeeze:
    """The server's end of an EASGD reply in `codec`: each slice of e the rule writes is
    encoded and replaced by its decoding before it is committed, so the center moves by
    exactly what the worker will apply."""

    def __init__(self, codec: Codec, size: int) -> None:
        self.codec, self.size = codec, size
        self.encoded = np.empty(codec.encoded_size(size), np.uint8)

    def __call__(self, start: int, out: np.ndarray) -> None:
        codec = self.codec
        begin = codec.byte_offset(start)
        part = self.encoded[begin : begin + codec.encoded_size(out.size)]
        codec.decode(codec.encode(out, part), out)

    def refused(self, out: np.ndarray, slice_keys: int) -> None:
        """After a refused slice (its part of the reply zeroed): every all-zero slice is
        encoded again as zeros, which every codec carries exactly."""
        for start in range(0, out.size, slice_keys):
            part = out[start : start + slice_keys]
            if not part.any():
                self(start, part)
