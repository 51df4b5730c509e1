"""Same-host payloads through shared memory: one region per connection, a sealed memfd.

A client on the server's host asks for a region in a sealed `attach` request; the server makes
a memfd, seals it against shrinking and growing, maps it and names it in its answer as
/proc/<server pid>/fd/<fd>, which the client (same user) opens and maps before its next
message, when the server closes that fd. The memory then lives exactly as long as the two
mappings, no file is left anywhere, and since nobody can resize the memfd, no mapping of it
can fault. The server never opens a file a peer names. The first half carries request
payloads, the second half replies; the sealed header still travels over the socket and says
which half holds the payload. Moving a tensor then costs one memory copy each way instead of
a trip through the kernel's TCP stack. When the client cannot open the region (another host,
another user, another container) the connection keeps sending frames.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import re
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from ember.errors import ProtocolError
from ember.wire.frames import same_place

SHM_DIR = "/dev/shm"
HANDOFF = re.compile(r"/proc/[0-9]+/fd/[0-9]+")
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
DISABLE_VARIABLE = "EMBER_SHARED_MEMORY"  # "0" keeps every payload on the socket


def enabled() -> bool:
    return os.environ.get(DISABLE_VARIABLE, "1") != "0" and os.path.isdir(SHM_DIR)


class SharedFrame:
    """A payload frame that lies in a region: what zmq.Frame offers the readers of payloads."""

    __slots__ = ("buffer",)

    def __init__(self, buffer: memoryview) -> None:
        self.buffer = buffer

    def __len__(self) -> int:
        return self.buffer.nbytes


class Region:
    """A mapped shared-memory file of 2 x `half` bytes: requests in the first half, replies in
    the second."""

    def __init__(self, path: str, size: int, fd: int) -> None:
        self.path, self.size, self.half = path, size, size // 2
        # The views handed out keep the mapping alive; it is unmapped when the last one goes.
        self._memory = np.frombuffer(mmap.mmap(fd, size), dtype=np.uint8)

    @classmethod
    def sealed(cls, half: int) -> tuple[Region, int] | None:
        """A new region for payloads of up to `half` bytes each way, made by the process that
        maps it first (the server): a memfd sealed so that nobody can shrink or grow it, which
        a mapping of it can therefore never outlive (no SIGBUS). Returns it and the fd a peer
        of the same user opens as /proc/<pid>/fd/<fd>; None when this host cannot give one."""
        try:
            fd = os.memfd_create("ember-region", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except OSError:
            return None
        try:
            os.ftruncate(fd, 2 * half)
            # Reserve every page now: a full tmpfs fails here, not later as a SIGBUS.
            os.posix_fallocate(fd, 0, 2 * half)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
            return cls(f"/proc/{os.getpid()}/fd/{fd}", 2 * half, fd), fd
        except OSError:
            os.close(fd)
            return None

    @classmethod
    def join(cls, path: object, size: object) -> Region:
        """Map the region a server made, through the path its answer to `attach` names."""
        if not isinstance(path, str) or not HANDOFF.fullmatch(path):
            raise ProtocolError(f"shared-memory region {path!r} is not a server's memfd")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            raise ProtocolError(f"cannot open shared-memory region {path}: {exc}") from exc
        try:
            if _seals(fd) & SEALS != SEALS:
                raise ProtocolError(f"shared-memory region {path} is not sealed against resizing")
            if os.fstat(fd).st_size != size:
                raise ProtocolError(f"shared-memory region {path} does not hold {size!r} bytes")
            return cls(path, size, fd)
        finally:
            os.close(fd)

    def write(self, reply: bool, offset: int, data: Any) -> None:
        """Copy `data` (any C-contiguous buffer) into a half at byte `offset`; data already
        written there in place (see `half_view`) is left as it is."""
        source = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
        start = (self.half if reply else 0) + offset
        if offset + source.size > self.half:
            raise ProtocolError(f"{offset + source.size} bytes do not fit a {self.half}-byte half")
        target = self._memory[start : start + source.size]
        if not same_place(source, target):
            target[...] = source

    def half_view(self, reply: bool, floats: int) -> np.ndarray:
        """The first `floats` float32 of a half, for a peer to fill or read in place instead of
        copying a payload in or out."""
        start = self.half if reply else 0
        if 4 * floats > self.half:
            raise ProtocolError(f"{4 * floats} bytes do not fit a {self.half}-byte half")
        return self._memory[start : start + 4 * floats].view(np.float32)

    def write_all(self, reply: bool, arrays: Sequence[np.ndarray]) -> None:
        offset = 0
        for array in arrays:
            self.write(reply, offset, array.reshape(-1))
            offset += array.nbytes

    def frames(self, reply: bool, sizes: Sequence[int]) -> list[SharedFrame]:
        """Views of a half cut as the socket would have framed it (`sizes` from the header)."""
        if sum(sizes) > self.half:
            raise ProtocolError(f"{sum(sizes)} payload bytes exceed the {self.half}-byte half")
        out, offset = [], self.half if reply else 0
        for size in sizes:
            out.append(SharedFrame(self._memory[offset : offset + size].data))
            offset += size
        return out


def _seals(fd: int) -> int:
    try:
        return fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:  # not a memfd: a file that cannot be sealed at all
        return 0


def fits(arrays: Sequence[np.ndarray], region: Region | None) -> bool:
    return region is not None and 0 < sum(a.nbytes for a in arrays) <= region.half


class ServerRegions:
    """A server's side of its peers' regions: which peer has which, request payloads waiting to
    be handed out chunk by chunk, and replies being written before their header is sent."""

    def __init__(self, limit: int) -> None:
        self.limit = limit  # the largest payload a peer may send
        self._by_peer: dict[bytes, Region] = {}
        self._by_owner: dict[int, bytes] = {}
        self._handoff: dict[bytes, int] = {}  # peer -> fd of a region it has yet to open
        self._queued: deque[tuple[Any, SharedFrame]] = deque()
        self._replying: dict[bytes, tuple[Region, dict[str, Any], list[int]]] = {}
        self.payloads = self.replies = 0  # how many went through regions rather than the socket

    def attach(self, peer: bytes, header: dict[str, Any]) -> dict[str, Any]:
        """Make a region for a peer and name it in the answer; the peer opens it before its
        next message, when this side's fd is closed (the mapping stays). A file a peer names
        is never opened: it could be any file of this user, or be truncated under the mapping.
        A new region of the same owner (a worker's next connection) releases the previous one."""
        if peer in self._by_peer:  # its payloads may be in the one it has: not swapped under them
            return {"attached": False, "reason": "this connection already has a region"}
        size = header.get("bytes")
        if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= 2 * self.limit:
            return {"attached": False, "reason": f"region of {size!r} bytes is outside the limit"}
        made = Region.sealed(size // 2)
        if made is None:
            return {"attached": False, "reason": "this host cannot give a shared-memory region"}
        region, fd = made
        self._close_handoff(peer)
        self._handoff[peer] = fd
        self._by_peer[peer] = region
        owner = header.get("owner")
        if isinstance(owner, int) and not isinstance(owner, bool):
            previous = self._by_owner.get(owner)
            if previous is not None and previous != peer:
                self._by_peer.pop(previous, None)
            self._by_owner[owner] = peer
        return {"attached": True, "path": region.path, "bytes": region.size}

    def opened(self, peer: bytes) -> None:
        """`peer` sent a message after its region's answer: it has opened the region (or never
        will), so this side's fd closes."""
        if self._handoff:
            self._close_handoff(peer)

    def _close_handoff(self, peer: bytes) -> None:
        fd = self._handoff.pop(peer, None)
        if fd is not None:
            os.close(fd)

    def stats(self) -> dict[str, int]:
        return {"peers": len(self._by_peer), "payloads": self.payloads, "replies": self.replies}

    def queue_payload(self, request: Any) -> None:
        """A request whose header says its payload lies in the region: its frames are handed
        out by next_chunk, as the socket's would be."""
        region = self._by_peer.get(request.peer)
        if region is None:
            raise ProtocolError("payload in shared memory, but this connection has no region")
        self._queued.extend((request, frame) for frame in region.frames(False, request.sizes))
        self.payloads += 1

    def next_chunk(self) -> tuple[Any, SharedFrame] | None:
        return self._queued.popleft() if self._queued else None

    def forget(self, peer: bytes) -> None:
        self._queued = deque(item for item in self._queued if item[0].peer != peer)

    def drop(self, peer: bytes) -> None:
        """A peer's connection closed: its region is unmapped once no view refers to it."""
        self.forget(peer)
        self._close_handoff(peer)
        self._by_peer.pop(peer, None)
        self._replying.pop(peer, None)
        for owner, holder in list(self._by_owner.items()):
            if holder == peer:
                del self._by_owner[owner]

    def start_reply(self, request: Any, header: dict[str, Any], sizes: list[int]) -> bool:
        """Whether this reply's payload goes through the region; if so its header waits until
        write_reply has copied every byte."""
        region = self._by_peer.get(request.peer)
        total = sum(sizes)
        if region is None or not request.header.get("reply_shm") or not 0 < total <= region.half:
            return False
        self._replying[request.peer] = (region, {**header, "shm": True}, [0, total])
        return True

    def replying(self, peer: bytes) -> bool:
        return peer in self._replying

    def reply_view(self, peer: bytes) -> np.ndarray | None:
        """While a reply to `peer` goes through its region: the reply half as float32, for the
        server to compute the reply in place."""
        if peer not in self._replying:
            return None
        region, _, progress = self._replying[peer]
        return region.half_view(True, progress[1] // 4)

    def write_reply(self, peer: bytes, data: Any) -> dict[str, Any] | None:
        """Copy one reply chunk; returns the header to send once the last one is in."""
        region, header, progress = self._replying[peer]
        region.write(True, progress[0], data)
        progress[0] += memoryview(data).nbytes
        if progress[0] < progress[1]:
            return None
        del self._replying[peer]
        self.replies += 1
        return header

    def close(self) -> None:
        for peer in list(self._handoff):
            self._close_handoff(peer)
        self._by_peer.clear()
        self._queued.clear()
        self._replying.clear()
