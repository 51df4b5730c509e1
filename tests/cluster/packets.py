"""Reading a capture of scripts/capture.py, and finding a secret's bytes in it.

`shares_window(frames, secret, 64)` is exact: every 64-byte window of the secret contains one
of its 32-byte chunks at a multiple of 32, so a frame holding a window holds such a chunk
somewhere. Frames are searched for those chunks through their first 8 bytes (NumPy, at each of
the 8 alignments), and each hit is extended both ways to the longest run the frame and the
secret share."""

from __future__ import annotations

import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ember.emulated.netns import Cluster

SCRIPT = Path(__file__).parent / "scripts" / "capture.py"
CHUNK = 32


def frames(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    offset = 0
    while offset + 4 <= len(data):
        (length,) = struct.unpack_from(">I", data, offset)
        yield data[offset + 4 : offset + 4 + length]
        offset += 4 + length


def shares_window(captured: Iterator[bytes], secret: bytes, window: int = 64) -> bool:
    """Whether any frame holds `window` (>= 2 * CHUNK - 1) consecutive bytes of `secret`."""
    assert window >= 2 * CHUNK - 1
    where: dict[int, list[int]] = {}
    for start in range(0, len(secret) - CHUNK + 1, CHUNK):
        chunk = secret[start : start + CHUNK]
        if len(set(chunk)) >= 8:  # zero runs and other filler match padding anywhere
            where.setdefault(int.from_bytes(chunk[:8], "little"), []).append(start)
    keys = np.array(sorted(where), dtype=np.uint64)
    for frame in captured:
        raw = np.frombuffer(frame, dtype=np.uint8)
        for align in range(8):
            usable = (raw.size - align) // 8 * 8
            if usable <= 0:
                continue
            words = raw[align : align + usable].view("<u8")
            for index in np.flatnonzero(np.isin(words, keys)):
                at = align + 8 * int(index)
                for start in where[int(words[index])]:
                    if _shared_run(frame, at, secret, start) >= window:
                        return True
    return False


def _shared_run(frame: bytes, at: int, secret: bytes, start: int) -> int:
    """The length of the longest common run through frame[at] == secret[start]."""
    if frame[at : at + CHUNK] != secret[start : start + CHUNK]:
        return 0
    left = 0
    while at - left > 0 and start - left > 0 and frame[at - left - 1] == secret[start - left - 1]:
        left += 1
    right = CHUNK
    while (
        at + right < len(frame)
        and start + right < len(secret)
        and frame[at + right] == secret[start + right]
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
