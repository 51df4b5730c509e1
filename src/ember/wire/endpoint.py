"""ServerEndpoint: the server's ROUTER socket, its request streams and its replies."""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Collection, Sequence
from typing import Any, NoReturn

import numpy as np
import zmq

from ember.errors import ProtocolError
from ember.wire import curve
from ember.wire.bulk import ServerChannels, bulk_cipher
from ember.wire.bulk_cipher import BulkFrameRefused
from ember.wire.frames import MAX_REPLY_BYTES, chunk_frames, describe, frame_sizes, seal, unseal
from ember.wire.handshake import ServerHandshake
from ember.wire.hosts import LOCAL_TRANSPORTS, is_loopback
from ember.wire.identity import Identities
from ember.wire.lanes import PROBE_BYTES, ServerLanes
from ember.wire.peers import SCAN_SECONDS, PeerConnections, framed
from ember.wire.request import Chunk, Request, peer_address, reason, source_fd
from ember.wire.sessions import Sessions
from ember.wire.shared import ServerRegions
from ember.wire.sockets import ReplyBacklog, new_socket, raise_open_file_limit
from ember.wire.ticket import COPIED, SendTicket

# Reply bytes a peer may leave unread before its requests are refused (see ReplyBacklog); a
# ParameterServer sets a few copies of its shard instead.
UNREAD_BYTES = 64 << 20


class ServerEndpoint:
    """A ROUTER socket that serves only peers that proved they hold the run's secret.

    With `encrypt` (default: the process's setting, see curve.py) the transport is CURVE and
    only the run's clients get through its handshake; the HMAC handshake runs either way.
    Every message is a single frame, so a request's payload streams: a sealed header, then one
    message per tensor chunk, and a server can work on chunk k while k + 1 is on the wire.
    A peer first completes the handshake of handshake.py; each header afterwards is sealed
    with that connection's session key.
    """

    def __init__(
        self,
        secret: bytes,
        bind: str = "tcp://127.0.0.1:0",
        context: zmq.Context | None = None,
        max_payload_bytes: int = 1 << 34,
        encrypt: bool | None = None,
        max_unread_bytes: int = UNREAD_BYTES,
        payload_ops: Collection[str] | None = None,
        max_region_bytes: int | None = None,
        cipher: str | None = None,
    ) -> None:
        """`payload_ops`: the operations whose requests may carry a payload (of up to
        `max_payload_bytes`); a header of another that declares one is refused before any
        chunk is taken. None: every operation may. A peer's shared-memory region holds
        `max_region_bytes` each way at most (by default `max_payload_bytes`). `cipher`:
        "curve" or "aead" (default: curve.use_wire_cipher's)."""
        raise_open_file_limit()
        self._context = context or zmq.Context.instance()
        self.encrypted = curve.encrypting(encrypt)
        self.bulk = ServerChannels(bulk_cipher(self.encrypted, cipher))
        self._curve = self.encrypted and self.bulk.cipher is None  # the socket's mechanism
        self._sock = new_socket(self._context, zmq.ROUTER)
        self._domain: str | None = None
        if self._curve:
            self._domain = curve.secure_server(self._sock, secret, self._context)
        try:
            self._sock.bind(bind)
        except zmq.ZMQError:
            self._sock.close(linger=0)
            if self._domain is not None:
                curve.release_server(self._context, self._domain)
            raise
        self.address: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.max_payload_bytes = max_payload_bytes
        self._payload_ops = payload_ops
        self._handshake = ServerHandshake(secret, self._sock)
        self._sessions = Sessions()
        self.identities = Identities()
        self._streams: dict[bytes, Request] = {}  # peer -> request whose payload is arriving
        region = max_payload_bytes if max_region_bytes is None else max_region_bytes
        self._regions = ServerRegions(region)  # same-host peers' shared memory
        self._connections = PeerConnections(self._sock, self._curve)
        self._broken: deque[Chunk] = deque()  # streams whose connection closed, to report
        self.lanes = ServerLanes()  # connections striped over several sockets (lanes.py)
        self._backlog = ReplyBacklog(max_unread_bytes)
        self.rejected: Counter[str] = Counter()

    def poll(self, timeout: float) -> Request | Chunk | None:
        """Wait up to `timeout` seconds; return the next authenticated request header or
        payload chunk, if any. Connections are looked after every SCAN_SECONDS meanwhile."""
        deadline = time.monotonic() + timeout
        while True:
            self._drop_closed()
            if self._broken:
                return self._broken.popleft()
            if self.lanes.ready:  # a striped request's chunks, handed on in order
                request, frame = self.lanes.ready.popleft()
                request.frames.append(frame)
                return Chunk(request, len(request.frames) - 1)
            queued = self._regions.next_chunk()
            if queued is not None:  # a payload in shared memory is handed out as the socket's is
                request, frame = queued
                request.frames.append(frame)
                return Chunk(request, len(request.frames) - 1)
            wait = min(deadline - time.monotonic(), SCAN_SECONDS)
            if self._sock.poll(max(0, int(wait * 1000)), zmq.POLLIN):
                break
            if wait < SCAN_SECONDS:
                return None
        frames = self._sock.recv_multipart(copy=False)
        # A closed connection's state goes before anything read after it is handled: once
        # the close is processed its routing id is free, and a new peer may present it.
        self._drop_closed()
        peer, fd = frames[0].bytes, source_fd(frames[-1])
        handed = sum(framed(len(frame), self._curve) for frame in frames[1:])
        try:
            live = self._connections.arrived(fd, peer, handed)
            if not live and not self._sessions.made_on(peer, fd):  # a closing session's is kept
                raise ProtocolError("unauthenticated: its connection closed")
            if len(frames) != 2:
                raise ProtocolError(f"message of {len(frames) - 1} frames; ember sends one")
            return self._accept(peer, frames[1], fd)
        except ProtocolError as exc:
            self.rejected[reason(exc)] += 1
            stream = self._streams.pop(peer, None)
            return None if stream is None else Chunk(stream, len(stream.frames), str(exc))

    def _accept(self, peer: bytes, frame: Any, fd: int) -> Request | Chunk | None:
        key = self._sessions.key(peer, fd)
        if key is None:
            key = self._handshake.admit(peer, frame.bytes)
            if key is not None:
                self._sessions.open(peer, key, fd)
                self._connections.authenticate(peer)
                self.bulk.opened(peer, key)
            return None
        self._regions.opened(peer)
        if self.lanes.carries(peer):
            self._lane_frames(peer, lambda: self.lanes.take(peer, frame, self._opened))
            return None
        stream = self._streams.get(peer)
        if stream is not None:
            index = len(stream.frames)
            if self.bulk.cipher is not None:  # the tag first: a cut frame is a forged one
                frame = self._opened(peer, frame, stream, index)
            if len(frame) != stream.sizes[index]:
                raise ProtocolError(
                    f"payload frame {index} has {len(frame)} bytes, header declares "
                    f"{stream.sizes[index]}"
                )
            stream.frames.append(b"" if stream.dropped else frame)
            if stream.complete:
                del self._streams[peer]
                self._answer_probe(stream)
            return None if stream.dropped else Chunk(stream, index)
        header = unseal(key, frame.buffer)
        if header["op"] == "bind":  # an older client naming its port: SRCFD says it now
            return None
        if header["op"] == "attach":
            answer = {"op": "ok", "seq": header.get("seq"), **self._attach(peer, header, frame)}
            self._sock.send_multipart([peer, seal(key, answer)])
            return None
        if header["op"] in ("lanes", "lane"):
            answer = {"op": "ok", "seq": header.get("seq"), **self.lanes.register(peer, header)}
            self._sock.send_multipart([peer, seal(key, answer)])
            return None
        if self._backlog.over_budget(peer):
            # Serve nothing more to a peer that leaves replies unread: what it would be sent
            # next stays here until it reads (a reply's buffer may be a copy of its own).
            self._refuse(peer, key, header, self._backlog.refusal(peer))
        limit = PROBE_BYTES if header["op"] == "probe" else self._payload_limit(header["op"])
        try:
            sizes = frame_sizes(header.get("tensors", []), limit)
        except ProtocolError as exc:
            self._refuse(
                peer, key, header, str(exc) if limit else f"{header['op']!r} takes no payload"
            )
        if sizes and self._sessions.is_closing(peer):
            raise ProtocolError("connection closed: its payload is not taken")
        request = Request(peer, header, [], sizes, self.bulk.binding(frame.buffer))
        request.dropped = header["op"] == "probe"  # read and let go: only its time counts
        if "lanes" in header and not header.get("shm"):
            try:
                self.lanes.stripe(request, header["lanes"])
            except ProtocolError as exc:  # a lane it names is gone: it connects anew
                self._refuse(peer, key, header, str(exc), lanes_lost=True)
            self._lane_frames(peer, lambda: self.lanes.flush(request, self._opened))
        elif sizes and header.get("shm"):
            try:
                self._regions.queue_payload(request)
            except ProtocolError as exc:  # e.g. a newer connection of its worker took over
                self._refuse(peer, key, header, str(exc))
        elif sizes:
            self._streams[peer] = request
        if request.dropped and not sizes:
            self._answer_probe(request)
        return None if request.dropped else request

    def _lane_frames(self, peer: bytes, take: Callable[[], Request | None]) -> None:
        """Chunks of a striped request taken; one that fails ends the connection and lanes."""
        try:
            finished = take()
        except ProtocolError as exc:
            self._end_lanes(peer, str(exc))
            raise
        if finished is not None:
            self._answer_probe(finished)

    def _end_lanes(self, peer: bytes, why: str, closed: bool = False) -> None:
        """Forget `peer`'s lanes and report what they carried; cut them, and `peer` unless
        `closed` (its connection went or stays), where a failure or a half-done request ends
        them: between requests its client closes them itself."""
        broken, others = self.lanes.closed(peer, failed=not closed)
        if closed and not broken:
            others = []
        for member in others if closed else (peer, *others):
            self._connections.cut(member, "lane")
            self._sessions.end(member)  # nothing more is answered on a connection cut
        self._broken.extend(Chunk(r, len(r.frames), why) for r in broken)

    def _answer_probe(self, request: Request) -> None:
        """A probe's payload is all in: tell its sender, who times it (lanes.probe)."""
        key = self._sessions.key(request.peer)
        if request.header["op"] == "probe" and key is not None:
            answer = {"op": "ok", "seq": request.header.get("seq")}
            self._sock.send_multipart([request.peer, seal(key, answer)])

    def _opened(self, peer: bytes, frame: Any, stream: Request, index: int) -> Any:
        """A bulk frame checked and decrypted; a refused one ends the peer's connection and
        session at once, so nothing more of it is taken."""
        if self.bulk.cipher is None:
            return frame
        try:
            return self.bulk.open(peer, frame.buffer, stream.sealed, index)
        except BulkFrameRefused:
            self._connections.cut(peer, "forged")
            self._sessions.end(peer)
            raise

    def _payload_limit(self, op: str) -> int:
        if self._payload_ops is None or op in self._payload_ops:
            return self.max_payload_bytes
        return 0

    def _refuse(
        self, peer: bytes, key: bytes, header: dict[str, Any], message: str, **fields: bool
    ) -> NoReturn:
        """Answer a request refused at its header with one error, and count it. A striped
        one's chunks are on their way on its lanes, which end (its client then closes)."""
        reply = {"op": "error", "seq": header.get("seq"), "message": message, **fields}
        if "lanes" in header:
            reply["lanes_ended"] = True
        self._sock.send_multipart([peer, seal(key, reply)])
        if "lanes" in header:
            self._end_lanes(peer, message, closed=True)
        raise ProtocolError(message)

    def _attach(self, peer: bytes, header: dict[str, Any], frame: Any) -> dict[str, Any]:
        """Map a peer's region only when the peer is on this host's loopback: hosts emulated
        on one machine share /dev/shm, so being able to map the region proves nothing."""
        where = peer_address(frame)
        if not (self.address.startswith(LOCAL_TRANSPORTS) or is_loopback(where)):
            self.rejected["remote_region"] += 1
            return {"attached": False, "reason": f"peer {where or '(unknown)'} is not on loopback"}
        owner = header.get("owner")
        if isinstance(owner, int) and not isinstance(owner, bool):
            refused = self.identities.claim(peer, owner)
            if refused is not None:
                self.rejected["identity"] += 1
                return {"attached": False, "reason": refused}
        return self._regions.attach(peer, header)

    def _drop_closed(self) -> None:
        """Forget what each peer whose connection closed held: its region and stream at once
        (the stream's request is reported broken, so the server lets go of it too), its
        session after CLOSING_SECONDS. Payload chunks carry no MAC, so a closing peer starts
        no payload: a new connection presenting its routing id continues nothing."""
        for peer in self._connections.closed():
            self._sessions.closing(peer)
            self._handshake.forget(peer)
            self.identities.release(peer)
            self._regions.drop(peer)
            self._backlog.forget(peer)
            stream = self._streams.pop(peer, None)
            if stream is not None:
                self._broken.append(Chunk(stream, len(stream.frames), "connection closed"))
            self._end_lanes(peer, "connection closed", closed=True)
        for peer in self._sessions.expired():
            self.bulk.drop(peer)
        self._connections.police()

    def forget_stream(self, peer: bytes) -> None:
        """Drop the frames kept for a request whose payload will never complete."""
        self._streams.pop(peer, None)
        self._regions.forget(peer)
        self.lanes.drop(peer)

    def reply(
        self,
        request: Request,
        header: dict[str, Any],
        arrays: Sequence[np.ndarray] = (),
        track: bool = False,
    ) -> SendTicket | None:
        """Send a sealed reply and its arrays' chunks. Arrays go zero-copy: with `track`, the
        returned ticket says when zmq no longer reads them; do not modify them before that."""
        if not self.reply_header(request, header, describe(arrays) if arrays else None):
            return None
        tickets = [self.reply_chunk(request, frame) for frame in chunk_frames(arrays)]
        return SendTicket.joined(tickets) if track and tickets else None

    def reply_header(
        self, request: Request, header: dict[str, Any], table: list[Any] | None
    ) -> bool:
        """Start a reply whose payload chunks follow through reply_chunk; False if the peer
        never authenticated."""
        key = self._sessions.key(request.peer)
        if key is None:
            return False
        if header.get("op") == "error" and self._streams.get(request.peer) is request:
            # A refused request gets no more of its payload kept: what follows its header
            # is the peer's next request, and chunks still on the wire fail as headers;
            # AEAD chunks are opened and dropped, as the next one must carry the next counter.
            self.forget_stream(request.peer)
            if self.bulk.cipher is not None and not request.complete:
                request.dropped, request.frames[:] = True, [b""] * len(request.frames)
                self._streams[request.peer] = request
        if header.get("op") == "error" and request.lanes and not request.complete:
            self.lanes.drop(request.peer)
        if table:
            header = {**header, "tensors": table}
            if self._regions.start_reply(request, header, frame_sizes(table, MAX_REPLY_BYTES)):
                return True  # the header follows the payload's last byte into shared memory
            if request.lanes:
                header["lanes"] = len(request.lanes)
        sealed = seal(key, header)
        request.reply_binding = self.bulk.binding(sealed)
        self._sock.send_multipart([request.peer, sealed], copy=False)
        return True

    def reply_chunk(self, request: Request, frame: Any) -> SendTicket:
        """Send one payload frame zero-copy; the ticket says when zmq is done reading it.
        A reply through shared memory is copied at once, so its ticket is already done."""
        if self._regions.replying(request.peer):
            header = self._regions.write_reply(request.peer, frame)
            key = self._sessions.key(request.peer)
            if header is not None and key is not None:
                self._sock.send_multipart([request.peer, seal(key, header)])
            return COPIED
        index, lanes = request.replied, request.lanes or (request.peer,)
        request.replied += 1
        peer = lanes[index % len(lanes)]
        boxed = self.bulk.seal(peer, memoryview(frame), request.reply_binding, index)  # None: as is
        if boxed is not None and not boxed:
            return COPIED  # the peer's keys went with its connection: nothing goes in clear
        self._sock.send(peer, zmq.SNDMORE)
        tracker = self._sock.send(frame if boxed is None else boxed, 0, copy=False, track=True)
        self._backlog.sent(request.peer, memoryview(frame).nbytes, tracker)
        return SendTicket(tracker) if boxed is None else COPIED

    def reply_view(self, request: Request) -> np.ndarray | None:
        """After reply_header: where a reply through shared memory lands, as float32, so the
        caller can compute it there and hand reply_chunk the views; None on the socket."""
        return self._regions.reply_view(request.peer)

    @property
    def peer_state(self) -> dict[str, int]:
        """How many peers hold a session, a stream or a region, and connections known."""
        regions = self._regions.stats()["peers"]
        sizes = {"sessions": len(self._sessions), "streams": len(self._streams)}
        sizes["backlogged"] = self._backlog.peers()
        sizes["handshaking"] = self._handshake.pending
        sizes["identities"] = len(self.identities)
        sizes.update(self.lanes.stats())
        shed = {f"shed_{reason}": count for reason, count in self._connections.shed.items()}
        return {**sizes, "regions": regions, **self._connections.stats(), **shed}

    @property
    def shared_memory(self) -> dict[str, int]:
        """Connections with a shared-memory region, and the payloads and replies it carried."""
        return self._regions.stats()

    def close(self) -> None:
        self._regions.close()
        self._connections.close()
        self._sock.close(linger=1000)  # bounded: the last reply (to `stop`) still goes out
        if self._domain is not None:
            curve.release_server(self._context, self._domain)
            self._domain = None
