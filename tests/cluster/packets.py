"""Reading a capture of scripts/capture.py, and finding a secret's bytes in it.

`shares_window(frames, secret, 64)` is exact: every 64-byte window of the secret contains one
of its 32-byte chunks at a multiple of 32, so a frame holding a window holds such a chunk
somewhere. Frames are searched for those chunks through their first 8 bytes, at each of the 8
alignments, many frames at once: a table of the keys' low bits passes about one word in a
thousand of noise, the candidates are looked up exactly, and each hit is extended both ways to
the longest run its frame and the secret share. A capture is hundreds of megabytes, and one
NumPy call per frame took minutes where this takes seconds."""

from __future__ import annotations

import struct
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from ember_lab.emulated.netns import Cluster

SCRIPT = Path(__file__).parent / "scripts" / "capture.py"
CHUNK = 32
BATCH_BYTES = 64 << 20  # frames searched together
TABLE_BITS = 24  # the prefilter's size: 16 MiB of booleans


def frames(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    offset = 0
    while offset + 4 <= len(data):
        (length,) = struct.unpack_from(">I", data, offset)
        yield data[offset + 4 : offset + 4 + length]
        offset += 4 + length


def shares_window(captured: Iterable[bytes], secret: bytes, window: int = 64) -> bool:
    """Whether any frame holds `window` (>= 2 * CHUNK - 1) consecutive bytes of `secret`."""
    assert window >= 2 * CHUNK - 1
    chunks = _Chunks(secret)
    if not chunks.where:
        return False
    batch: list[bytes] = []
    size = 0
    for frame in captured:
        batch.append(frame)
        size += len(frame)
        if size >= BATCH_BYTES:
            if chunks.found_in(batch, window):
                return True
            batch, size = [], 0
    return chunks.found_in(batch, window)


class _Chunks:
    """The secret's 32-byte chunks at multiples of 32, keyed by their first 8 bytes."""

    def __init__(self, secret: bytes) -> None:
        self.secret = secret
        self.where: dict[int, list[int]] = {}
        for start in range(0, len(secret) - CHUNK + 1, CHUNK):
            chunk = secret[start : start + CHUNK]
            if len(set(chunk)) >= 8:  # zero runs and other filler match padding anywhere
                self.where.setdefault(int.from_bytes(chunk[:8], "little"), []).append(start)
        self.keys = np.array(sorted(self.where), dtype=np.uint64)
        self.table = np.zeros(1 << TABLE_BITS, dtype=bool)
        self.table[self.keys & np.uint64((1 << TABLE_BITS) - 1)] = True

    def found_in(self, frames: list[bytes], window: int) -> bool:
        data = b"".join(frames)
        bounds = np.cumsum([0, *map(len, frames)])  # frame i is data[bounds[i]:bounds[i + 1]]
        raw = np.frombuffer(data, dtype=np.uint8)
        low = np.uint64((1 << TABLE_BITS) - 1)
        for align in range(8):
            usable = (raw.size - align) // 8 * 8
            if usable <= 0:
                continue
            words = raw[align : align + usable].view("<u8")
            candidates = np.flatnonzero(self.table[words & low])
            found = words[candidates]
            slots = np.minimum(np.searchsorted(self.keys, found), self.keys.size - 1)
            for index in candidates[self.keys[slots] == found]:
                at = align + 8 * int(index)
                frame = int(np.searchsorted(bounds, at, side="right")) - 1
                begin, end = int(bounds[frame]), int(bounds[frame + 1])
                for start in self.where[int(words[index])]:
                    if _shared_run(data, begin, end, at, self.secret, start) >= window:
                        return True
        return False


def _shared_run(data: bytes, begin: int, end: int, at: int, secret: bytes, start: int) -> int:
    """The length of the longest common run through data[at] == secret[start], inside the
    frame data[begin:end]."""
    if at + CHUNK > end or data[at : at + CHUNK] != secret[start : start + CHUNK]:
        return 0
    left = 0
    while (
        at - left > begin and start - left > 0 and data[at - left - 1] == secret[start - left - 1]
    ):
        left += 1
    right = CHUNK
    while (
        at + right < end
        and start + right < len(secret)
        and data[at + right] == secret[start + right]
    ):
        right += 1
    return left + right


class Capture:
    """scripts/capture.py running in the switch's namespace while the `with` body runs."""

    def __init__(self, cluster: Cluster, out: Path, seconds: float, max_bytes: int) -> None:
        self.cluster, self.out = cluster, out
        self.argv = [sys.executable, str(SCRIPT), str(out), str(seconds), str(max_bytes)]
        self.seconds = seconds

    def __enter__(self) -> Capture:
        self.process = self.cluster.popen("switch", self.argv, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != "capturing":
            raise RuntimeError("the capture did not start")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.process.terminate()
        try:
            self.process.communicate(timeout=30)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.communicate(timeout=10)

    def frames(self) -> Iterator[bytes]:
        return frames(self.out)
