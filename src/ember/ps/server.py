"""ParameterServer: one contiguous key range of the flat parameters, with an injected rule."""

from __future__ import annotations

import itertools
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from ember.errors import ProtocolError
from ember.ps.clocks import ClockTable, WorkerEntry
from ember.ps.consistency import Consistency
from ember.ps.replica import Replicated
from ember.wire import Chunk, Request, SendTicket, ServerEndpoint

# Payload views alias zmq's read-only receive buffers; the rules only ever read them.
warnings.filterwarnings("ignore", message="The given buffer is not writable")
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


ALL_KEYS = slice(0, 1 << 62)  # a reply or snapshot that reads every key of the shard
WORKER_OPS = ("register", "push", "pull", "done")  # what only a shard's primary serves
MAX_ERROR_CHARS = 1000


class UpdateRule(Protocol):
    """How pushes fold into the shard. Algorithms implement it; the server never imports them."""

    @property
    def name(self) -> str: ...

    @property
    def replies(self) -> bool:
        """Whether a push is answered with the tensor `contribute` wrote into `out`."""
        ...

    @property
    def state_names(self) -> tuple[str, ...]:
        """Per-key state the rule keeps beside the parameters (saved in checkpoints)."""
        ...

    def contribute(
        self, params: torch.Tensor, payload: torch.Tensor, out: torch.Tensor | None
    ) -> torch.Tensor:
        """What this push adds to the round (it may alias `payload` or `out`)."""
        ...

    def commit(
        self, params: torch.Tensor, state: dict[str, torch.Tensor], folded: torch.Tensor, count: int
    ) -> None:
        """Apply the sum of `count` contributions to the parameters in place."""
        ...


@dataclass(frozen=True)
class ShardSpec:
    index: int  # which shard of `count`
    count: int
    start: int  # first key (element of the flat parameter vector) this shard owns
    stop: int


def shard_ranges(total: int, count: int) -> list[tuple[int, int]]:
    """Split [0, total) into `count` contiguous ranges whose sizes differ by at most one."""
    bounds = [total * i // count for i in range(count + 1)]
    return list(itertools.pairwise(bounds))


@dataclass
class _Held:
    request: Request
    worker: WorkerEntry
    payload: list[torch.Tensor] | None  # chunk views of zmq's receive buffers, as they arrive
    folded: bool = False
    streaming: bool = False  # folded chunk by chunk as it arrives, each answered at once
    offset: int = 0  # keys folded so far while streaming
    reply: torch.Tensor | None = None  # easgd's elastic difference, filled chunk by chunk
    pooled: bool = True  # the reply buffer returns to the pool (not a shared-memory view)
    trackers: list[SendTicket] = field(default_factory=list)


class ParameterServer(Replicated):
    """A store with an injected update rule; the consistency policy decides when to answer."""

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
        role: str = "primary",
        backup: str | None = None,
        replica_seconds: float = 0.25,
    ) -> None:
        """A `backup` server only takes copies from its primary until it is promoted; a
        primary with a `backup` address ships it a copy of its state every replica_seconds."""
        size = shard.stop - shard.start
        if params.shape != (size,) or params.dtype != np.float32:
            raise ValueError(
                f"shard {shard.index} wants float32[{size}], got {params.dtype}{list(params.shape)}"
            )
        self.shard, self.rule, self.consistency = shard, rule, consistency
        self.params = torch.from_numpy(np.array(params, dtype=np.float32, copy=True))
        self.state = {name: torch.zeros(size) for name in rule.state_names}
        for name, value in (state or {}).items():
            self.state[name].copy_(torch.from_numpy(np.asarray(value, dtype=np.float32)))
        self.round_sum = torch.zeros(size) if consistency.synchronous else None
        self.round_count = 0
        self.round_clock = 0  # the clock whose contributions round_sum holds
        self.step = step  # commits applied to the parameters
        # Slow process start-up (spawn, imports, data) must not count as silence.
        self.clocks = ClockTable(
            expected_workers, workers, worker_timeout, startup_grace=max(120.0, worker_timeout)
        )
        self.endpoint = ServerEndpoint(secret, bind)
        self.address = self.endpoint.address
        self.rejected: Counter[str] = Counter()
        self.counters: Counter[str] = Counter()
        self._held: list[_Held] = []
        self._arriving: dict[bytes, _Held] = {}  # peer -> push whose payload is on the wire
        # Replies in flight that read self.params (and state), with the keys they read.
        self._trackers: list[tuple[slice, SendTicket]] = []
        self._reply_pool: list[tuple[torch.Tensor, SendTicket | None]] = []
        self._running = True
        self._secret, self.role, self.replica_seconds = secret, role, replica_seconds
        self._replicated_at = 0.0
        self._copy_arriving: Request | None = None  # a copy from the primary, accepted header
        self.replicator = self._replicator(backup)

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
                    self._arriving.pop(request.peer, None)
                    # the reason may quote the bad value: bounded, so the reply always seals
                    message = str(exc)[:MAX_ERROR_CHARS]
                    self.endpoint.reply(request, {"op": "error", "message": message})
            self._drop_silent_workers()
            self._maybe_replicate()
        if self.replicator is not None:
            self.replicator.close()
        self.endpoint.close()

    def _handle(self, request: Request) -> None:
        header, op = request.header, request.header["op"]
        if op in WORKER_OPS and self.role != "primary":
            self.counters["not_primary"] += 1
            message = f"shard {self.shard.index} at {self.address} is a backup"
            self.endpoint.reply(request, {"op": "error", "not_primary": True, "message": message})
            return
        if op in ("push", "pull"):
            worker = self._known_worker(header)
            seq = _int(header, "seq")
            if seq <= worker.last_seq:  # a repeated (worker, incarnation, seq): ack, never re-apply
                self._answer_duplicate(request, worker, seq)
                return
            worker.last_seq = seq
            _int(header, "step")
            if op == "pull":
                self._held.append(_Held(request, worker, None))
                self._drain()
                return
            self._check_payload(request)
            held = _Held(request, worker, [])
            self._arriving[request.peer] = held
            if self._can_stream(held):
                self._start_stream(held)
        elif op == "register":
            worker_id = _int(header, "worker")
            entry = self.clocks.register(worker_id, _int(header, "incarnation"), self.step)
            self.endpoint.reply(
                request,
                {
                    "op": "ok",
                    "clock": entry.clock,
                    "step": entry.step,
                    "keys": [self.shard.start, self.shard.stop],
                },
            )
            self._forget_dead_streams()
            self._drain()
        elif op == "done":
            self._leave(header)
            self.endpoint.reply(request, {"op": "ok"})
            self._maybe_commit_round()  # the leaver may have been the last one a round awaited
            self._drain()
        elif op == "snapshot":
            self._snapshot(request)
        elif op == "stats":
            self.endpoint.reply(request, {"op": "ok", **self.stats()})
        elif op == "stop":
            self.endpoint.reply(request, {"op": "ok", **self.stats()})
            self._running = False
        elif op == "replicate":
            self._check_replica(request)
        elif op == "promote":
            self._promote(request)
        else:
            raise ProtocolError(f"unknown op {op!r}")

    def _answer_duplicate(self, request: Request, worker: WorkerEntry, seq: int) -> None:
        """A request sent again (its reply was lost with a failed server) is not applied
        twice, but gets a reply of the shape it expects: a read is safe to repeat, and an
        elastic difference it never received is answered as zero, a step it does not take."""
        self.counters["duplicates"] += 1
        worker.answered_seq = max(worker.answered_seq, seq)
        header = {"op": "ok", "duplicate": True, "seq": seq}
        if request.header["op"] == "pull" or request.header.get("pull"):
            tracker = self.endpoint.reply(request, header, [self.params.numpy()], track=True)
            if tracker is not None:
                self._trackers.append((ALL_KEYS, tracker))
        elif request.header["op"] == "push" and self.rule.replies:
            zeros = self._reply_buffer().zero_()
            tracker = self.endpoint.reply(request, header, [zeros.numpy()], track=True)
            self._reply_pool.append((zeros, tracker))
        else:
            self.endpoint.reply(request, header)

    def _known_worker(self, header: dict[str, Any]) -> WorkerEntry:
        try:
            return self.clocks.known(_int(header, "worker"), _int(header, "incarnation"))
        except ProtocolError:
            self.rejected["incarnation"] += 1
            raise

    def _check_payload(self, request: Request) -> None:
        """Refuse a push whose header does not fit this shard before any of its payload is used."""
        size = self.shard.stop - self.shard.start
        if request.header.get("keys") != [self.shard.start, self.shard.stop]:
            self.rejected["keys"] += 1
            raise ProtocolError(
                f"push for keys {request.header.get('keys')!r}, this shard holds "
                f"[{self.shard.start}, {self.shard.stop}]"
            )
        table = request.header.get("tensors")
        if table != [["float32", [size]]]:
            self.rejected["shape"] += 1
            raise ProtocolError(
                f"push must carry one float32 tensor of shape [{size}], got {table!r}"
            )

    # ---- streaming: a push folded chunk by chunk while the rest is still on the wire ----------
    def _can_stream(self, held: _Held) -> bool:
        """Only when nothing can make this push wait: the policy answers it now (and its pull
        too), no earlier request of the worker is held, and no synchronous round collects it."""
        worker, slowest = held.worker, self._min_clock()
        pull = bool(held.request.header.get("pull"))
        return (
            self.round_sum is None
            and self.consistency.ready(worker.clock, slowest)
            and (not pull or self.consistency.ready(worker.clock + 1, slowest))
            and not any(h.worker is worker for h in self._held)
        )

    def _start_stream(self, held: _Held) -> None:
        size = self.shard.stop - self.shard.start
        held.streaming = True
        pull = bool(held.request.header.get("pull"))
        if not (self.rule.replies or pull):
            return  # a bare acknowledgement waits until every chunk is applied (_finish_stream)
        header = self._reply_fields(held, clock=held.worker.clock + 1, step=self.step + 1)
        self.endpoint.reply_header(held.request, header, [["float32", [size]]])
        if self.rule.replies:
            # Through shared memory, the reply is computed where the worker will read it.
            in_place = self.endpoint.reply_view(held.request)
            held.reply = self._reply_buffer() if in_place is None else torch.from_numpy(in_place)
            held.pooled = in_place is None

    def _on_chunk(self, chunk: Chunk) -> None:
        if chunk.request.header.get("op") == "replicate":
            if chunk.request is not self._copy_arriving or self.role != "backup":
                return  # refused at its header
            if chunk.error is not None:
                self._copy_arriving = None
                raise ProtocolError(chunk.error)
            if chunk.request.complete:
                self._copy_arriving = None
                self._apply_replica(chunk.request)
            return
        held = self._arriving.get(chunk.request.peer)
        if held is None or held.request is not chunk.request:
            return  # the push was refused at its header; its chunks are dropped
        if chunk.error is not None:
            raise ProtocolError(chunk.error)
        frame = chunk.request.frames[chunk.index]
        values = torch.from_numpy(np.frombuffer(frame.buffer, dtype=np.float32))
        if held.streaming:
            self._fold_streamed(held, values)
        else:
            assert held.payload is not None
            held.payload.append(values)
        if chunk.request.complete:
            del self._arriving[chunk.request.peer]
            if held.streaming:
                self._finish_stream(held)
            else:
                self._held.append(held)
                self._drain()

    def _fold_streamed(self, held: _Held, values: torch.Tensor) -> None:
        keys = slice(held.offset, held.offset + values.numel())
        self._release_params_for_writing(keys)  # another worker's reply may still read them
        params = self.params[keys]
        out = None if held.reply is None else held.reply[keys]
        if self._finite(values, out):
            contribution = self.rule.contribute(params, values, out)
            self.rule.commit(params, {k: v[keys] for k, v in self.state.items()}, contribution, 1)
        held.offset = keys.stop
        if out is not None:
            held.trackers.append(self.endpoint.reply_chunk(held.request, out.numpy()))
        elif held.request.header.get("pull"):
            tracker = self.endpoint.reply_chunk(held.request, params.numpy())
            self._trackers.append((keys, tracker))  # it reads the live parameters

    def _finish_stream(self, held: _Held) -> None:
        worker = held.worker
        answered = held.reply is not None or held.request.header.get("pull")
        ack = None if answered else self._reply_fields(held, worker.clock + 1, self.step + 1)
        worker.clock += 1
        worker.step = held.request.header["step"]
        worker.pulled_at = self.step + 1
        worker.answered_seq = held.request.header["seq"]
        self.step += 1
        self.counters["pushes"] += 1
        self.counters["replies"] += 1
        self.counters["streamed"] += 1
        if held.reply is not None and held.pooled:
            self._reply_pool.append((held.reply, SendTicket.joined(held.trackers)))
        if ack is not None:
            self.endpoint.reply_header(held.request, ack, None)
        self._drain()  # a worker that was waiting on this one's clock may now go on

    # ---- folding and answering -----------------------------------------------------------------
    def _min_clock(self) -> int:
        return self.clocks.min_clock()

    def _drain(self) -> None:
        """Serve every held request the policy now allows, until nothing changes."""
        progress = True
        while progress:
            progress = False
            for held in list(self._held):
                if self._try_serve(held):
                    self._held.remove(held)
                    progress = True

    def _try_serve(self, held: _Held) -> bool:
        worker, header = held.worker, held.request.header
        if not worker.live:
            return True  # dropped while waiting: nobody to answer
        if held.payload is not None and not held.folded:
            if not self.consistency.ready(worker.clock, self._min_clock()):
                return False
            reply = self._fold(held.payload, worker.clock)
            held.folded, worker.clock = True, worker.clock + 1
            worker.step = header["step"]  # recorded when folded: a checkpoint never skips it
            self._maybe_commit_round()
            if reply is not None:  # easgd: the elastic difference answers the push at once
                self._answer(held, reply_tensor=reply)
                worker.pulled_at = self.step
                return True
        if header.get("pull", header["op"] == "pull"):
            if not self.consistency.ready(worker.clock, self._min_clock()):
                return False
            self._answer(held, reply_tensor=self.params, aliases_params=True)
            worker.pulled_at = self.step
        else:
            self._answer(held)
        return True

    def _fold(self, payload: list[torch.Tensor], clock: int) -> torch.Tensor | None:
        """Fold a push chunk by chunk straight from zmq's buffers: the rules are elementwise,
        so no contiguous copy of the payload is ever made."""
        out = self._reply_buffer() if self.rule.replies else None
        synchronous = self.round_sum is not None
        if not synchronous:
            self._release_params_for_writing()
        offset = 0
        for chunk in payload:
            keys = slice(offset, offset + chunk.numel())
            params = self.params[keys]
            if not self._finite(chunk, None if out is None else out[keys]):
                offset += chunk.numel()
                continue
            contribution = self.rule.contribute(params, chunk, None if out is None else out[keys])
            if self.round_sum is not None:
                # BSP folds only clock == min_clock, so a round never mixes clocks.
                self.round_sum[keys].add_(contribution)
            else:
                self.rule.commit(
                    params, {k: v[keys] for k, v in self.state.items()}, contribution, 1
                )
            offset += chunk.numel()
        self.counters["pushes"] += 1
        if synchronous:
            self.round_count, self.round_clock = self.round_count + 1, clock
        else:
            self.step += 1
        return out

    def _finite(self, chunk: torch.Tensor, out: torch.Tensor | None) -> bool:
        """A chunk holding NaN or Inf contributes nothing (its reply part is zero) and is
        counted, so one diverged worker cannot poison the shared parameters. The sum is a cheap
        test (a pass at memory speed); it also refuses values so large their sum overflows."""
        if bool(torch.isfinite(chunk.sum())):
            return True
        self.rejected["nonfinite"] += 1
        if out is not None:
            out.zero_()
        return False

    def _maybe_commit_round(self) -> None:
        if self.round_sum is None or self.round_count == 0:
            return
        if self._min_clock() > self.round_clock:  # every live worker has folded this round
            self._commit(self.round_sum, self.round_count)
            self.round_sum.zero_()
            self.round_count = 0

    def _commit(self, folded: torch.Tensor, count: int) -> None:
        self._release_params_for_writing()
        self.rule.commit(self.params, self.state, folded, count)
        self.step += 1

    def _answer(
        self, held: _Held, reply_tensor: torch.Tensor | None = None, aliases_params: bool = False
    ) -> None:
        header = self._reply_fields(held, held.worker.clock, self.step)
        arrays = [reply_tensor.numpy()] if reply_tensor is not None else []
        tracker = self.endpoint.reply(held.request, header, arrays, track=bool(arrays))
        held.worker.answered_seq = max(held.worker.answered_seq, header["seq"])
        if tracker is not None:
            if aliases_params:
                self._trackers.append((ALL_KEYS, tracker))
            elif reply_tensor is not None:
                self._reply_pool.append((reply_tensor, tracker))
        self.counters["replies"] += 1

    def _reply_fields(self, held: _Held, clock: int, step: int) -> dict[str, Any]:
        """The reply header; staleness counts the updates others made since this worker's
        last read, as of the moment after its own push (`step`)."""
        pushed = held.payload is not None
        staleness = max(0, step - held.worker.pulled_at - 1) if pushed else 0
        return {
            "op": "ok",
            "seq": held.request.header["seq"],
            "clock": clock,
            "step": step,
            "staleness": staleness,
        }

    def _reply_buffer(self) -> torch.Tensor:
        """A reusable reply buffer zmq has finished sending (fresh pages cost a first touch)."""
        for i, (buffer, tracker) in enumerate(self._reply_pool):
            if tracker is None or tracker.done:
                del self._reply_pool[i]
                return buffer
        return torch.empty(self.shard.stop - self.shard.start)

    def _release_params_for_writing(self, keys: slice = ALL_KEYS) -> None:
        """Before an in-place update of `keys`: if zmq still reads them for a reply or snapshot
        in flight, move on to a private copy and leave the old buffer to zmq, so a slow reader
        never sees a torn update and never stalls the server."""
        self._trackers = [(read, t) for read, t in self._trackers if not t.done]
        if not any(_overlap(read, keys) for read, _ in self._trackers):
            return
        self.params = self.params.clone()
        self.state = {name: value.clone() for name, value in self.state.items()}
        self._trackers.clear()
        self.counters["copies_for_slow_readers"] += 1

    def _leave(self, header: dict[str, Any]) -> None:
        """`done` is idempotent: a worker re-sending it after a failover, to a backup whose
        copy already saw it leave (or never saw it join), has nothing more to do."""
        entry = self.clocks.entries.get(_int(header, "worker"))
        if entry is not None and entry.incarnation == _int(header, "incarnation"):
            self.clocks.finish(entry)

    def _drop_silent_workers(self) -> None:
        if self.role != "primary":
            return  # a backup hears from nobody; its copies say who is live
        if self.clocks.drop_silent({id(h.worker) for h in self._held}):
            self._forget_dead_streams()
            self._maybe_commit_round()
            self._drain()

    def _forget_dead_streams(self) -> None:
        """A push whose worker died mid-stream (replaced by a new incarnation, or dropped for
        silence) will never complete: forget it, and the frames the endpoint kept for it."""
        for peer, held in list(self._arriving.items()):
            if not held.worker.live:
                del self._arriving[peer]
                self.endpoint.forget_stream(peer)

    # ---- introspection -------------------------------------------------------------------------
    def _snapshot(self, request: Request) -> None:
        names = ["params", *self.rule.state_names]
        arrays = [self.params.numpy(), *(self.state[n].numpy() for n in self.rule.state_names)]
        header = {
            "op": "ok",
            "names": names,
            "step": self.step,
            "workers": self.clocks.table(),
        }
        tracker = self.endpoint.reply(request, header, arrays, track=True)
        if tracker is not None:
            self._trackers.append((ALL_KEYS, tracker))

    def stats(self) -> dict[str, Any]:
        return {
            "shard": self.shard.index,
            "role": self.role,
            "replication": self.replicator.stats() if self.replicator is not None else None,
            "step": self.step,
            "counters": dict(self.counters),
            "rejected": dict(self.rejected + self.endpoint.rejected),
            "events": list(self.clocks.events),
            "live_workers": sorted(w for w, e in self.clocks.entries.items() if e.live),
            "shared_memory": self.endpoint.shared_memory,
        }


def _overlap(a: slice, b: slice) -> bool:
    return a.start < b.stop and b.start < a.stop


def _int(header: dict[str, Any], key: str) -> int:
    value = header.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProtocolError(f"header field {key!r} must be an integer, got {value!r}")
    return value
