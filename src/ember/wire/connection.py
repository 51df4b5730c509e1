"""ClientConnection: one authenticated DEALER connection, its requests, replies and timeouts."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from ember.errors import EmberError, NotPrimary, ProtocolError, ServerGone, ServerUnavailable
from ember.wire import curve
from ember.wire.bulk import BulkChannel, bulk_cipher, chunk_aad
from ember.wire.bulk_cipher import BulkFrameRefused
from ember.wire.frames import MAX_REPLY_BYTES, chunk_frames, describe, frame_sizes, seal, unseal
from ember.wire.handshake import open_session
from ember.wire.hosts import endpoint_is_local
from ember.wire.lanes import MAX_LANES
from ember.wire.shared import Region, SharedFrame, fits
from ember.wire.sockets import new_socket

# A watched connection looks for a broken TCP session this often while it waits for a reply.
WATCH_SLICE = 0.25
# What the connection's monitor reports: the server leaving, or refusing the transport.
TRANSPORT_EVENTS = (
    zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
# A CURVE server that cannot open a client's HELLO (another run's keys) just drops it, and
# the client retries: that many drops in a row are a refusal, not a server going away.
REFUSALS = 2
# What a ClientConnection raises when its peer is down, restarting or misbehaving.
CONNECTION_ERRORS = (EmberError, zmq.ZMQError)


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
        encrypt: bool | None = None,
        cipher: str | None = None,
    ) -> None:
        """With `watch`, a reply awaited from a server whose process died raises ServerGone
        within a fraction of a second instead of waiting out the timeout. The handshake waits
        `connect_timeout` (default `timeout`): a server that is not there never disconnects.
        With `encrypt` (default: the process's setting, see curve.py) the transport is CURVE;
        a server that refuses this connection's keys or transport is a ProtocolError at once.
        `cipher` ("curve" or "aead", default curve.use_wire_cipher's) says what encrypts."""
        self.address = address
        self.timeout = timeout
        self.encrypted = curve.encrypting(encrypt)
        self.bulk_cipher = bulk_cipher(self.encrypted, cipher)
        self._secret, self._cipher = secret, cipher  # for lanes, which open sessions alike
        self._lanes: list[tuple[ClientConnection, zmq.Context]] = []  # lanes.py
        self._lane_token: str | None = None
        self._bulk: BulkChannel | None = None
        self._context = context or zmq.Context.instance()
        self._sock = new_socket(self._context, zmq.DEALER)
        if self.encrypted and self.bulk_cipher is None:
            curve.secure_client(self._sock, secret)
        # Watched during the handshake whatever `watch` says: a refused transport handshake
        # shows only here, and a peer that refuses it never answers.
        self._monitor: zmq.Socket | None = self._sock.get_monitor_socket(TRANSPORT_EVENTS)
        self._watch = watch
        self._handshakes_failed = 0  # failed transport handshakes (each also disconnects)
        self._disconnects = 0
        self._closed = False
        self._region: Region | None = None  # shared memory with a server on this host
        self._in_flight = 0  # requests sent and not yet answered
        try:
            self._sock.connect(address)
            self.timeout = timeout if connect_timeout is None else connect_timeout
            self._key = open_session(address, secret, self._sock.send, self._handshake_reply)
            if self.bulk_cipher is not None:
                self._bulk = BulkChannel(self._key, "client", self.bulk_cipher)
            self.timeout = timeout
            if not watch:
                self._unwatch()
        except BaseException:
            self.close()
            raise

    def _handshake_reply(self) -> bytes:
        return self._next_frame(self.timeout, "(wrong secret, or the server is not running)").bytes

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
        the region of that worker's previous connection. Offered only to a server reached
        through loopback: another host may share this one's /dev/shm (containers, emulated
        hosts), and payloads meant for the network would then skip it."""
        if not endpoint_is_local(self.address):
            return False
        self.send({"op": "attach", "seq": 0, "bytes": 2 * payload_bytes, "owner": owner})
        answer = self.recv()[0]
        if not answer.get("attached"):
            return False
        try:  # opened before anything else is sent: the server closes its fd after that
            self._region = Region.join(answer.get("path"), answer.get("bytes"))
        except ProtocolError:
            return False  # another user's server, or none: the socket carries everything
        return True

    @property
    def lane_count(self) -> int:
        """Sockets a request's chunks are striped over (lanes.py): this one and its lanes."""
        return 1 + len(self._lanes)

    def set_lanes(self, count: int) -> None:
        """Stripe the chunks of requests and replies over `count` sockets from now on: lanes
        beyond it close, new ones open their own sessions (and I/O threads) and join."""
        if not 1 <= count <= MAX_LANES:
            raise ValueError(f"lanes must be 1 to {MAX_LANES}, not {count}")
        while len(self._lanes) >= count:
            lane, context = self._lanes.pop()
            lane.close()
            context.term()
        if count > self.lane_count and self._lane_token is None:
            self.send({"op": "lanes", "seq": 0})
            self._lane_token = str(self.recv()[0].get("token"))
        while self.lane_count < count:
            context = zmq.Context(io_threads=1)
            try:
                lane = ClientConnection(
                    self.address,
                    self._secret,
                    self.timeout,
                    context,
                    watch=True,
                    encrypt=self.encrypted,
                    cipher=self._cipher,
                )
                lane.send(
                    {"op": "lane", "seq": 0, "token": self._lane_token, "index": self.lane_count}
                )
                lane.recv()
            except BaseException:
                context.destroy(linger=0)
                raise
            self._lanes.append((lane, context))

    def send(self, header: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> None:
        """Send the header, then each chunk as a message of its own, zero-copy: the arrays must
        stay alive and unmodified until the reply arrives. With a shared-memory region and no
        other request in flight, the arrays are copied into the region instead, and the reply
        may come back through it. With lanes, chunk i goes on socket i % lane_count."""
        region = self._region if self._in_flight == 0 else None
        if arrays:
            header = {**header, "tensors": describe(arrays)}
        lanes = [self]
        if region is not None:
            header = {**header, "reply_shm": True}
            if fits(arrays, region):
                region.write_all(False, arrays)
                header["shm"], arrays = True, ()
        elif self._lanes:
            header = {**header, "lanes": self.lane_count}
            lanes += [lane for lane, _ in self._lanes]
        sealed = seal(self._key, header)
        self._sock.send(sealed, copy=False)
        self._in_flight += 1
        for index, frame in enumerate(chunk_frames(arrays)):
            lanes[index % len(lanes)]._send_chunk(frame, sealed, index)

    def _send_chunk(self, frame: memoryview, sealed: bytes, index: int) -> None:
        if self._bulk is None:
            self._sock.send(frame, copy=False)
        else:  # sealed into a buffer of its own, which zmq sends without a copy
            self._sock.send(self._bulk.seal_new(frame, chunk_aad(sealed, index)), copy=False)

    def notify(self, header: dict[str, Any], timeout: float) -> bool:
        """Send a header that gets no reply, if the socket takes it within `timeout`; False
        (and the header dropped) when it does not, as when the peer is gone or falls behind."""
        if not self._sock.poll(max(0, int(timeout * 1000)), zmq.POLLOUT):
            return False
        try:
            self._sock.send(seal(self._key, header), zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def recv(
        self, timeout: float | None = None, into: np.ndarray | None = None
    ) -> tuple[dict[str, Any], list[Any]]:
        """Next reply as (header, payload frames); payload views alias the frames, or the
        shared-memory region until the next send. The whole reply must arrive within the
        timeout. With `into` (a contiguous array), a reply over the socket that is one tensor
        of its dtype and size is copied there frame by frame as it arrives, and the frames
        returned are views of `into`."""
        wait = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        header_frame = self._next_frame(wait).buffer
        header = unseal(self._key, header_frame)
        self._in_flight = max(0, self._in_flight - 1)
        if header["op"] == "error":
            if header.get("lanes_ended"):  # its chunks are still coming: they would be out of step
                self.close()
            if header.get("lanes_lost"):  # a lane dropped between requests: connect anew
                why = header.get("message", "a lane it names is gone")
                raise ServerGone(f"parameter server at {self.address} lost a lane: {why}")
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
        # Copying each frame while it is still in cache, then dropping it, keeps one frame
        # alive instead of the whole reply: zmq's receive buffers are reused, not new pages.
        try:
            return header, self._chunks(header, header_frame, sizes, into, deadline)
        except CONNECTION_ERRORS:
            if self._lanes:  # what is left of the reply on its lanes would be read as the next's
                self.close()
            raise

    def _chunks(
        self,
        header: dict[str, Any],
        header_frame: Any,
        sizes: list[int],
        into: np.ndarray | None,
        deadline: float,
    ) -> list[Any]:
        """A reply's payload frames off the socket, each checked (and opened) in turn."""
        target = _landing(header, into)
        lanes = self._reply_lanes(header)
        frames: list[Any] = []
        offset = 0
        for index, size in enumerate(sizes):
            lane = lanes[index % len(lanes)]
            frame = lane._next_frame(deadline - time.monotonic())
            if lane._bulk is not None:  # into scratch when it is then copied to `target`
                frame = lane._opened(frame, chunk_aad(header_frame, index), target is not None)
            if len(frame) != size:
                raise ProtocolError(
                    f"server at {self.address} sent a {len(frame)}-byte frame, its header "
                    f"declares {size}"
                )
            if target is None:
                frames.append(frame)
                continue
            view = target[offset : offset + size]
            view[...] = np.frombuffer(frame.buffer, dtype=np.uint8)
            frames.append(SharedFrame(view.data))
            offset += size
        return frames

    def _reply_lanes(self, header: dict[str, Any]) -> list[ClientConnection]:
        """The sockets a reply's chunks come on: the lanes its header names, which must be
        this connection's."""
        count = header.get("lanes", 1)
        if count != self.lane_count and count != 1:
            raise ProtocolError(
                f"server at {self.address} striped a reply over {count!r} lanes; "
                f"this connection has {self.lane_count}"
            )
        return [self, *(lane for lane, _ in self._lanes)] if count != 1 else [self]

    def _opened(self, frame: Any, aad: bytes, scratch: bool) -> Any:
        """A bulk frame checked and decrypted, never into the caller's arrays (the cipher
        writes before it checks): a refused one ends the connection."""
        assert self._bulk is not None
        try:
            return self._bulk.open(frame.buffer, aad, self._bulk.inbox if scratch else None)
        except BulkFrameRefused as exc:
            self.close()
            raise ProtocolError(f"server at {self.address}: {exc}; connection closed") from None

    @property
    def refused_frames(self) -> int:
        """Bulk frames from the server refused (one at most: the first closes the connection)."""
        return 0 if self._bulk is None else self._bulk.refused

    def _disconnected(self) -> bool:
        """Whether the server dropped the connection (only a watched one tells); a refused
        transport handshake raises ProtocolError instead."""
        if self._monitor is None:
            return False
        while self._monitor.poll(0, zmq.POLLIN):
            event = recv_monitor_message(self._monitor)
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self._disconnects += 1
                continue
            self._handshakes_failed += 1
            mismatch = event["value"] == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
            if mismatch or event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                raise ProtocolError(self._refusal(mismatch))
            if self._handshakes_failed >= REFUSALS:
                raise ProtocolError(self._refusal(False))
        # a failed handshake disconnects too, but that is the server refusing, not leaving
        return self._watch and self._disconnects > self._handshakes_failed

    def _refusal(self, mismatch: bool) -> str:
        if mismatch:
            mine = "off" if not self.encrypted else f"on, {self.bulk_cipher or 'curve'}"
            return (
                f"server at {self.address} speaks another transport: this side runs"
                f" --encrypt {mine}; start both with the same --encrypt and wire cipher"
            )
        return (
            f"server at {self.address} refused the run's secret: its encrypted (CURVE)"
            " handshake failed, so the keys this side holds are not the run's"
        )

    def _unwatch(self) -> None:
        if self._monitor is not None:
            self._sock.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = None

    def close(self, linger: float = 0.0) -> None:
        """Close; messages not yet sent get up to `linger` seconds to leave, in the background."""
        if self._closed:
            return
        self._closed = True
        self._region = None  # unmapped once no reply view refers to it
        for lane, context in self._lanes:
            lane.close()
            context.term()
        self._lanes = []
        self._unwatch()
        self._sock.close(linger=int(linger * 1000))


def _landing(header: dict[str, Any], into: np.ndarray | None) -> np.ndarray | None:
    """`into` as bytes when the reply is exactly one tensor of its dtype and size, else None
    (the frames are returned as they came, for the caller's checks to judge)."""
    if into is None or not into.flags.c_contiguous:
        return None
    if header.get("tensors") != [[into.dtype.name, [into.size]]]:
        return None
    return into.reshape(-1).view(np.uint8)
