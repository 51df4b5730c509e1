"""Lanes: one connection's traffic striped over several sockets, for links that one stream
(one TCP connection, one libzmq I/O thread copying every byte) cannot fill.

A client connection asks its server for a token (`op: lanes`); each extra socket, a lane,
opens its own authenticated session (its own session key and, under "aead", its own bulk
keys and counters) and presents the token (`op: lane`, with its index). A request whose
header says `lanes: K` then sends its chunk i on lane i % K, lane 0 being the connection
itself, and its reply's chunk i comes back the same way; the header always travels on the
connection. A lane carries nothing but chunks, in order, so the server knows each chunk's
index from the lane and how many of the request's chunks that lane carried before; a bulk
frame's tag binds its header's MAC and that index as on one socket. The server hands the
chunks on in order, keeping those that arrive ahead of an earlier one (bounded by the
request's declared size), and those that arrive ahead of their request's header (bounded by
EARLY_BYTES). A lane that closes or fails mid-request ends the connection and every lane.

How many lanes is striping.py's: a probe at connect, or a count the run names.
"""

from __future__ import annotations

import secrets
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from ember.errors import ProtocolError
from ember.wire.request import Request

MAX_LANES = 8
# Frames a lane may deliver before its request's header is read: the header leaves first,
# but on another connection, which the server may read a little later.
EARLY_BYTES = 64 << 20
EARLY_FRAME_COST = 4096  # what an early frame is charged beyond its bytes: a frame of none costs
PROBE_BYTES = 16 << 20  # a probe's payload, at most: the server reads and discards it

# Opens (checks and decrypts) a frame of `request` at `index` that came on lane `peer`.
FrameOpener = Callable[[bytes, Any, Request, int], Any]


@dataclass
class _Striped:
    """A striped request whose chunks are arriving: how many each lane has delivered, and
    those that came ahead of an earlier chunk."""

    request: Request
    taken: list[int]
    waiting: dict[int, Any] = field(default_factory=dict)
    handed: int = 0  # chunks handed on, in order

    def share(self, lane: int) -> int:
        return len(range(lane, len(self.request.sizes), len(self.request.lanes)))

    @property
    def finished(self) -> bool:
        return sum(self.taken) == len(self.request.sizes)


class ServerLanes:
    """A server's lanes: which connection each belongs to, and the chunks they carry."""

    def __init__(self) -> None:
        self._tokens: dict[bytes, str] = {}  # connection -> the token its lanes present
        self._by_token: dict[str, bytes] = {}
        self._lanes: dict[bytes, dict[int, bytes]] = {}  # connection -> index -> lane
        self._owner: dict[bytes, bytes] = {}  # lane -> its connection
        self._expected: dict[bytes, deque[_Striped]] = {}  # lane -> requests it carries
        self._early: dict[bytes, deque[Any]] = {}  # lane -> frames ahead of their header
        self._early_bytes: Counter[bytes] = Counter()  # connection -> bytes of those
        self.ready: deque[tuple[Request, Any]] = deque()  # chunks to hand on, in order
        self.striped = 0  # requests striped so far
        self.most = 1  # the most lanes one of them used

    def register(self, peer: bytes, header: dict[str, Any]) -> dict[str, Any]:
        """Answer `op: lanes` (a connection asks for a token) or `op: lane` (a lane joins)."""
        if peer in self._owner:
            return _refused("a lane carries chunks only")
        if header["op"] == "lanes":
            if peer not in self._tokens:
                fresh = secrets.token_hex(16)
                self._tokens[peer], self._by_token[fresh] = fresh, peer
                self._lanes[peer] = {}
            return {"most": MAX_LANES, "token": self._tokens[peer]}
        token, index = header.get("token"), header.get("index")
        owner = self._by_token.get(token) if isinstance(token, str) else None
        if owner is None or owner == peer or peer in self._tokens:
            return _refused("unknown lane token")
        if not _count(index, 1, MAX_LANES - 1) or index in self._lanes[owner]:
            return _refused(f"lane index {index!r} is taken or outside 1..{MAX_LANES - 1}")
        self._lanes[owner][index], self._owner[peer] = peer, owner
        return {}

    def carries(self, peer: bytes) -> bool:
        """Whether `peer`'s next frame is a striped request's chunk."""
        return peer in self._owner or bool(self._expected.get(peer))

    def stripe(self, request: Request, count: object) -> None:
        """Send `request`'s chunks (and its reply's) over `count` lanes; ProtocolError when the
        connection has not registered them."""
        lanes = self._lanes.get(request.peer, {})
        if not _count(count, 2, MAX_LANES) or any(j not in lanes for j in range(1, count)):
            raise ProtocolError(f"lane count {count!r} names lanes this connection has not opened")
        request.lanes = (request.peer, *(lanes[j] for j in range(1, count)))
        if request.header["op"] != "probe":  # the counts say what carried the run
            self.striped, self.most = self.striped + 1, max(self.most, count)
        striped = _Striped(request, [0] * count)
        for index, lane in enumerate(request.lanes):
            if striped.share(index):
                self._expected.setdefault(lane, deque()).append(striped)

    def flush(self, request: Request, opener: FrameOpener) -> Request | None:
        """Take the frames `request`'s lanes sent ahead of its header; returns the request if
        they were all its chunks."""
        finished = None
        for lane in request.lanes[1:]:
            early = self._early.get(lane)
            while early and self._expected.get(lane):
                frame = early.popleft()
                self._early_bytes[request.peer] -= len(frame) + EARLY_FRAME_COST
                finished = self.take(lane, frame, opener) or finished
        return finished

    def take(self, peer: bytes, frame: Any, opener: FrameOpener) -> Request | None:
        """A chunk from `peer`, a lane or a striped request's own connection; returns its
        request once all its chunks arrived."""
        queue = self._expected.get(peer)
        if not queue:
            owner = self._owner[peer]
            self._early_bytes[owner] += len(frame) + EARLY_FRAME_COST
            if self._early_bytes[owner] > EARLY_BYTES:
                raise ProtocolError(f"lane ran {EARLY_BYTES >> 20} MiB ahead of its requests")
            self._early.setdefault(peer, deque()).append(frame)
            return None
        striped = queue[0]
        request = striped.request
        lane = request.lanes.index(peer)
        index = lane + striped.taken[lane] * len(request.lanes)
        frame = opener(peer, frame, request, index)
        if len(frame) != request.sizes[index]:
            raise ProtocolError(
                f"payload frame {index} has {len(frame)} bytes, header declares "
                f"{request.sizes[index]}"
            )
        striped.taken[lane] += 1
        if striped.taken[lane] == striped.share(lane):
            queue.popleft()
        if not request.dropped:
            striped.waiting[index] = frame
            while striped.handed in striped.waiting:
                self.ready.append((request, striped.waiting.pop(striped.handed)))
                striped.handed += 1
        return request if striped.finished else None

    def drop(self, peer: bytes) -> None:
        """The striped requests of connection `peer` still arriving are refused: their chunks
        are still taken (and opened, to keep the bulk counters), then let go."""
        for lane in (peer, *self._lanes.get(peer, {}).values()):
            for striped in self._expected.get(lane, ()):
                striped.request.dropped = True
                striped.waiting.clear()
                striped.request.frames[:] = [b""] * len(striped.request.frames)
        self.ready = deque(item for item in self.ready if not item[0].dropped)

    def closed(self, peer: bytes, failed: bool = False) -> tuple[list[Request], list[bytes]]:
        """`peer`'s connection closed, or `failed` (sent what was refused): the requests it
        leaves unfinished, and the connection and lanes that go with it. A lane that closes
        between requests goes alone; otherwise the connection's lanes are all forgotten."""
        owner = self._owner.get(peer, peer)
        members = [owner, *self._lanes.get(owner, {}).values()]
        broken: list[Request] = []
        for lane in members:
            for striped in self._expected.get(lane, ()):
                if peer in striped.request.lanes and all(r is not striped.request for r in broken):
                    broken.append(striped.request)
        if peer != owner and not broken and not failed:
            self._forget_lane(owner, peer)
            return [], []
        for lane in members:
            self._expected.pop(lane, None)
            self._early.pop(lane, None)
            self._owner.pop(lane, None)
        self._lanes.pop(owner, None)
        self._by_token.pop(self._tokens.pop(owner, ""), None)
        self._early_bytes.pop(owner, None)
        self.ready = deque(item for item in self.ready if all(item[0] is not r for r in broken))
        return [r for r in broken if not r.dropped], [m for m in members if m != peer]

    def _forget_lane(self, owner: bytes, lane: bytes) -> None:
        lanes = self._lanes.get(owner, {})
        for index in [i for i, p in lanes.items() if p == lane]:
            del lanes[index]
        self._owner.pop(lane, None)
        self._expected.pop(lane, None)
        early = self._early.pop(lane, ())
        self._early_bytes[owner] -= sum(len(f) + EARLY_FRAME_COST for f in early)

    def stats(self) -> dict[str, int]:
        """Lanes open now, and frames that arrived ahead of their header."""
        return {"lanes": len(self._owner), "early_frames": sum(map(len, self._early.values()))}

    def usage(self) -> dict[str, int]:
        """Requests striped over the run, and the most lanes one used."""
        return {"striped_requests": self.striped, "most_lanes": self.most}


def _count(value: object, low: int, high: int) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _refused(message: str) -> dict[str, Any]:
    return {"op": "error", "message": message}
