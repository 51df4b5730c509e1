"""ZeroMQ endpoints: an authenticated ROUTER for servers, a DEALER connection for clients."""

from __future__ import annotations

import hmac
import os
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from ember.errors import EmberError, NotPrimary, ProtocolError, ServerGone, ServerUnavailable
from ember.wire.frames import (
    CHUNK_BYTES,
    MAC_BYTES,
    MAX_HEADER_BYTES,
    chunk_frames,
    describe,
    frame_sizes,
    mac,
    seal,
    unseal,
)
from ember.wire.shared import Region, ServerRegions, fits
from ember.wire.ticket import COPIED, SendTicket

# Handshake messages are a tag followed by 32 bytes (a nonce or a MAC).
HELLO, CHALLENGE, PROOF = b"EMBER2-HELLO", b"EMBER2-CHALLENGE", b"EMBER2-PROOF"
WELCOME, DENIED = b"EMBER2-OK", b"EMBER2-DENIED"
MAX_REPLY_BYTES = 1 << 36  # replies come from an authenticated server; this only bounds a bug
NONCE_BYTES = 32
MAX_PENDING_HANDSHAKES = 1024
# A frame is a header or one tensor chunk; anything larger makes zmq drop the peer before
# the bytes are buffered, so an oversized length never reaches an allocation of ours.
MAX_FRAME_BYTES = max(CHUNK_BYTES, MAC_BYTES + MAX_HEADER_BYTES) + 1024
# A watched connection looks for a broken TCP session this often while it waits for a reply.
WATCH_SLICE = 0.25
# What a ClientConnection raises when its peer is down, restarting or misbehaving.
CONNECTION_ERRORS = (EmberError, zmq.ZMQError)


def _socket(context: zmq.Context, kind: int) -> zmq.Socket:
    sock = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
    sock.setsockopt(zmq.SNDBUF, 4 << 20)
    sock.setsockopt(zmq.RCVBUF, 4 << 20)
    return sock


@dataclass
class Request:
    """An authenticated request. Its payload streams in after the header, one message per
    chunk: `frames` fills as they arrive, and `sizes` says what each must hold."""

    peer: bytes
    header: dict[str, Any]
    frames: list[Any] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)  # declared byte size of each payload frame

    @property
    def complete(self) -> bool:
        return len(self.frames) == len(self.sizes)


@dataclass
class Chunk:
    """One payload frame of a streaming request has arrived (it is request.frames[index]), or
    the stream broke (`error` says why; the request gets no more chunks)."""

    request: Request
    index: int
    error: str | None = None


class ServerEndpoint:
    """A ROUTER socket that serves only peers that proved they hold the run's secret.

    Every message is a single frame, so a request's payload streams: a sealed header, then one
    message per tensor chunk, and a server can work on chunk k while k + 1 is on the wire.
    Handshake (raw bytes, nothing parsed before it succeeds): HELLO | client nonce ->
    CHALLENGE | server nonce -> PROOF | HMAC(secret, "proof" | sn | cn) -> OK | HMAC(secret,
    "server" | sn | cn). Each header afterwards is sealed with the per-connection key
    HMAC(secret, "session" | sn | cn), so a frame replayed on another connection fails its MAC.
    """

    def __init__(
        self,
        secret: bytes,
        bind: str = "tcp://127.0.0.1:0",
        context: zmq.Context | None = None,
        max_payload_bytes: int = 1 << 34,
    ) -> None:
        self._secret = secret
        self._context = context or zmq.Context.instance()
        self._sock = _socket(self._context, zmq.ROUTER)
        self._sock.bind(bind)
        self.address: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.max_payload_bytes = max_payload_bytes
        self._pending: OrderedDict[bytes, bytes] = OrderedDict()  # peer -> nonces sn|cn
        self._sessions: dict[bytes, bytes] = {}  # peer -> session key
        self._streams: dict[bytes, Request] = {}  # peer -> request whose payload is arriving
        self._regions = ServerRegions(max_payload_bytes)  # same-host peers' shared memory
        self.rejected: Counter[str] = Counter()

    def poll(self, timeout: float) -> Request | Chunk | None:
        """Wait up to `timeout` seconds; return the next authenticated request header or
        payload chunk, if any."""
        queued = self._regions.next_chunk()
        if queued is not None:  # a payload in shared memory is handed out as the socket's is
            request, frame = queued
            request.frames.append(frame)
            return Chunk(request, len(request.frames) - 1)
        if not self._sock.poll(int(timeout * 1000), zmq.POLLIN):
            return None
        frames = self._sock.recv_multipart(copy=False)
        peer = frames[0].bytes
        try:
            if len(frames) != 2:
                raise ProtocolError(f"message of {len(frames) - 1} frames; ember sends one")
            return self._accept(peer, frames[1])
        except ProtocolError as exc:
            self.rejected[_reason(exc)] += 1
            stream = self._streams.pop(peer, None)
            return None if stream is None else Chunk(stream, len(stream.frames), str(exc))

    def _accept(self, peer: bytes, frame: Any) -> Request | Chunk | None:
        key = self._sessions.get(peer)
        if key is None:
            self._handshake(peer, frame.bytes)
            return None
        stream = self._streams.get(peer)
        if stream is not None:
            index = len(stream.frames)
            if len(frame) != stream.sizes[index]:
                raise ProtocolError(
                    f"payload frame {index} has {len(frame)} bytes, header declares "
                    f"{stream.sizes[index]}"
                )
            stream.frames.append(frame)
            if stream.complete:
                del self._streams[peer]
            return Chunk(stream, index)
        header = unseal(key, frame.buffer)
        if header["op"] == "attach":
            answer = {"op": "ok", "seq": header.get("seq"), **self._regions.attach(peer, header)}
            self._sock.send_multipart([peer, seal(key, answer)])
            return None
        sizes = frame_sizes(header.get("tensors", []), self.max_payload_bytes)
        request = Request(peer, header, [], sizes)
        if sizes and header.get("shm"):
            try:
                self._regions.queue_payload(request)
            except ProtocolError as exc:  # e.g. a newer connection of its worker took over
                message = {"op": "error", "seq": header.get("seq"), "message": str(exc)}
                self._sock.send_multipart([peer, seal(key, message)])
                raise
        elif sizes:
            self._streams[peer] = request
        return request

    def _handshake(self, peer: bytes, data: bytes) -> None:
        tag, value = data[:-NONCE_BYTES], data[-NONCE_BYTES:]
        if tag == HELLO:
            nonces = os.urandom(NONCE_BYTES) + value
            self._pending[peer] = nonces
            while len(self._pending) > MAX_PENDING_HANDSHAKES:
                self._pending.popitem(last=False)
            self._sock.send_multipart([peer, CHALLENGE + nonces[:NONCE_BYTES]])
            return
        saved = self._pending.get(peer)
        if tag == PROOF and saved is not None:
            nonces = saved
            del self._pending[peer]
            if not hmac.compare_digest(value, mac(self._secret, b"proof", nonces)):
                self._sock.send_multipart([peer, DENIED + bytes(NONCE_BYTES)])  # fail fast
                raise ProtocolError("unauthenticated: wrong secret")
            self._sessions[peer] = mac(self._secret, b"session", nonces)
            self._sock.send_multipart([peer, WELCOME + mac(self._secret, b"server", nonces)])
            return
        raise ProtocolError("unauthenticated: message before a completed handshake")

    def forget_stream(self, peer: bytes) -> None:
        """Drop the frames kept for a request whose payload will never complete."""
        self._streams.pop(peer, None)
        self._regions.forget(peer)

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
        key = self._sessions.get(request.peer)
        if key is None:
            return False
        if table:
            header = {**header, "tensors": table}
            if self._regions.start_reply(request, header, frame_sizes(table, MAX_REPLY_BYTES)):
                return True  # the header follows the payload's last byte into shared memory
        self._sock.send_multipart([request.peer, seal(key, header)], copy=False)
        return True

    def reply_chunk(self, request: Request, frame: Any) -> SendTicket:
        """Send one payload frame zero-copy; the ticket says when zmq is done reading it.
        A reply through shared memory is copied at once, so its ticket is already done."""
        if self._regions.replying(request.peer):
            header = self._regions.write_reply(request.peer, frame)
            if header is not None:
                sealed = seal(self._sessions[request.peer], header)
                self._sock.send_multipart([request.peer, sealed])
            return COPIED
        self._sock.send(request.peer, zmq.SNDMORE)
        return SendTicket(self._sock.send(frame, 0, copy=False, track=True))

    def reply_view(self, request: Request) -> np.ndarray | None:
        """After reply_header: where a reply through shared memory lands, as float32, so the
        caller can compute it there and hand reply_chunk the views; None on the socket."""
        return self._regions.reply_view(request.peer)

    @property
    def shared_memory(self) -> dict[str, int]:
        """Connections with a shared-memory region, and the payloads and replies it carried."""
        return self._regions.stats()

    def close(self) -> None:
        self._regions.close()
        self._sock.close(linger=0)


class ClientConnection:
    """One authenticated DEALER connection to a server; not thread-safe (one owner thread)."""

    def __init__(
        self,
        address: str,
        secret: bytes,
        timeout: float,
        context: zmq.Context | None = None,
        watch: bool = False,
        connect_timeout: float | None = None,
    ) -> None:
        """With `watch`, a reply awaited from a server whose process died raises ServerGone
        within a fraction of a second instead of waiting out the timeout. The handshake waits
        `connect_timeout` (default `timeout`): a server that is not there never disconnects."""
        self.address = address
        self.timeout = timeout
        self._context = context or zmq.Context.instance()
        self._sock = _socket(self._context, zmq.DEALER)
        self._monitor = self._sock.get_monitor_socket(zmq.EVENT_DISCONNECTED) if watch else None
        self._closed = False
        self._region: Region | None = None  # shared memory with a server on this host
        self._in_flight = 0  # requests sent and not yet answered
        try:
            self._sock.connect(address)
            self.timeout = timeout if connect_timeout is None else connect_timeout
            self._key = self._handshake(secret)
            self.timeout = timeout
        except BaseException:
            self.close()
            raise

    def _handshake(self, secret: bytes) -> bytes:
        client_nonce = os.urandom(NONCE_BYTES)
        self._sock.send(HELLO + client_nonce)
        tag, server_nonce = self._recv_raw()
        if tag != CHALLENGE:
            raise ProtocolError(f"server at {self.address} sent a malformed challenge")
        nonces = server_nonce + client_nonce
        self._sock.send(PROOF + mac(secret, b"proof", nonces))
        tag, proof = self._recv_raw()
        if tag == DENIED:
            raise ProtocolError(f"server at {self.address} refused the run's secret")
        if tag != WELCOME or not hmac.compare_digest(proof, mac(secret, b"server", nonces)):
            raise ProtocolError(f"server at {self.address} did not prove it holds the secret")
        return mac(secret, b"session", nonces)

    def _recv_raw(self) -> tuple[bytes, bytes]:
        data = self._next_frame(self.timeout, "(wrong secret, or the server is not running)")
        return data.bytes[:-NONCE_BYTES], data.bytes[-NONCE_BYTES:]

    def _next_frame(self, wait: float, hint: str = "") -> Any:
        deadline = time.monotonic() + wait
        while True:
            left = deadline - time.monotonic()
            step = left if self._monitor is None else min(left, WATCH_SLICE)
            if self._sock.poll(max(0, int(step * 1000)), zmq.POLLIN):
                break
            if self._disconnected():
                raise ServerGone(f"parameter server at {self.address} closed the connection")
            if step >= left:
                message = f"parameter server at {self.address} did not answer within {wait:g}s"
                raise ServerUnavailable(f"{message} {hint}".rstrip())
        frames = self._sock.recv_multipart(copy=False)
        if len(frames) != 1:
            raise ProtocolError(f"server at {self.address} sent a message of {len(frames)} frames")
        return frames[0]

    @property
    def shared(self) -> bool:
        """Whether payloads may go through a shared-memory region."""
        return self._region is not None

    def payload_views(self, floats: int) -> tuple[np.ndarray, np.ndarray] | None:
        """With a region: (request, reply) float32 views of its halves. A payload written into
        the request view is sent without a copy, and a reply read from the reply view needs
        none; the reply view holds the last reply until the next request is sent."""
        if self._region is None or 4 * floats > self._region.half:
            return None
        return self._region.half_view(False, floats), self._region.half_view(True, floats)

    def share_memory(self, payload_bytes: int, owner: int | None = None) -> bool:
        """Offer the server a shared-memory region for payloads of up to `payload_bytes` each
        way; True if it mapped it (same host). `owner` (a worker id) lets the server release
        the region of that worker's previous connection."""
        region = Region.create(payload_bytes)
        if region is None:
            return False
        try:
            self.send(
                {
                    "op": "attach",
                    "seq": 0,
                    "region": region.name,
                    "bytes": region.size,
                    "owner": owner,
                }
            )
            attached = bool(self.recv()[0].get("attached"))
        finally:
            region.unlink()  # mapped on both sides now, or not needed: no file is left behind
        self._region = region if attached else None
        return attached

    def send(self, header: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> None:
        """Send the header, then each chunk as a message of its own, zero-copy: the arrays must
        stay alive and unmodified until the reply arrives. With a shared-memory region and no
        other request in flight, the arrays are copied into the region instead, and the reply
        may come back through it."""
        region = self._region if self._in_flight == 0 else None
        if arrays:
            header = {**header, "tensors": describe(arrays)}
        if region is not None:
            header = {**header, "reply_shm": True}
            if fits(arrays, region):
                region.write_all(False, arrays)
                header["shm"], arrays = True, ()
        self._sock.send(seal(self._key, header), copy=False)
        self._in_flight += 1
        for frame in chunk_frames(arrays):
            self._sock.send(frame, copy=False)

    def recv(self, timeout: float | None = None) -> tuple[dict[str, Any], list[Any]]:
        """Next reply as (header, payload frames); payload views alias the frames, or the
        shared-memory region until the next send. The whole reply must arrive within the
        timeout."""
        wait = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        header = unseal(self._key, self._next_frame(wait).buffer)
        self._in_flight = max(0, self._in_flight - 1)
        if header["op"] == "error":
            if header.get("not_primary"):
                raise NotPrimary(f"server at {self.address} is not the primary of its shard")
            raise ProtocolError(
                f"server at {self.address} refused the request: "
                f"{header.get('message', 'no reason given')}"
            )
        sizes = frame_sizes(header.get("tensors", []), MAX_REPLY_BYTES)
        if header.get("shm"):
            if self._region is None:
                raise ProtocolError(
                    f"server at {self.address} answered into shared memory "
                    "this connection does not have"
                )
            return header, list(self._region.frames(True, sizes))
        frames = []
        for size in sizes:
            frame = self._next_frame(deadline - time.monotonic())
            if len(frame) != size:
                raise ProtocolError(
                    f"server at {self.address} sent a {len(frame)}-byte frame, its header "
                    f"declares {size}"
                )
            frames.append(frame)
        return header, frames

    def _disconnected(self) -> bool:
        if self._monitor is None:
            return False
        return bool(self._monitor.poll(0, zmq.POLLIN))  # the one event it reports: disconnected

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._region = None  # unmapped once no reply view refers to it
        if self._monitor is not None:
            self._sock.disable_monitor()
            self._monitor.close(linger=0)
        self._sock.close(linger=0)


def _reason(exc: ProtocolError) -> str:
    text = str(exc)
    for reason in ("unauthenticated", "HMAC", "msgpack", "size", "map"):
        if reason in text:
            return reason.lower()
    return "malformed"
