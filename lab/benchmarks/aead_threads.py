"""aead_threads: whether ember's bulk-frame sealing lets go of the GIL while it encrypts.

A worker's exchanger thread seals its pushes while its training thread computes, and a
server seals its replies beside its other threads: a cipher call that holds the GIL stops
them all for its length. Two figures, with the machine's preferred cipher (aes-256-gcm where
the CPU has AES instructions) and ember's own BulkSealer, one wire chunk a frame:
- threads: two threads each sealing --megabytes, against one thread sealing them alone
  (wall time of one over that of two, times two: 2.0 when the seals run side by side, 1.0 when
  one waits for the other). Target: >= 1.8 where the machine has two cores.
- beside: how far a pure-Python thread gets while the main thread seals, against how far it
  gets alone (1.0: the sealing never held it up). Target: >= 0.9.

Usage: python lab/benchmarks/aead_threads.py [--megabytes 256] [--repeat 5] [--quick] [--out F.json]
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import numpy as np

from common import check, fmt, make_parser, markdown_table, report, spread
from ember.probe import CHUNK_BYTES, bulk_cipher

MEGABYTES = 256  # sealed by each thread, per measurement
BESIDE_SECONDS = 0.5  # the counting thread's time alone


def seal(sealer: Any, megabytes: int) -> None:
    """Seal `megabytes` in frames of one wire chunk, into one preallocated buffer."""
    chunk = np.ones(CHUNK_BYTES, np.uint8)
    out = np.empty(CHUNK_BYTES + bulk_cipher.OVERHEAD, np.uint8)
    for _ in range(max(1, megabytes * (1 << 20) // CHUNK_BYTES)):
        sealer.seal_into(chunk, out)


def sealers(count: int) -> list[Any]:
    cipher = bulk_cipher.preferred_cipher()
    return [bulk_cipher.derive_bulk_keys(os.urandom(32), "client", cipher)[0] for _ in range(count)]


def threads_scaling(megabytes: int) -> float:
    """2 x (one thread's seconds) / (two threads' seconds side by side)."""
    alone, pair = sealers(1)[0], sealers(2)
    began = time.perf_counter()
    seal(alone, megabytes)
    one = time.perf_counter() - began
    workers = [threading.Thread(target=seal, args=(s, megabytes)) for s in pair]
    began = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=600)
    return 2 * one / (time.perf_counter() - began)


def beside(megabytes: int) -> float:
    """A counting thread's rate while the main thread seals, over its rate alone."""
    stop, counted = threading.Event(), [0]

    def count() -> None:
        while not stop.is_set():
            counted[0] += 1

    counter = threading.Thread(target=count)
    counter.start()
    try:
        time.sleep(0.05)  # started
        before, began = counted[0], time.perf_counter()
        time.sleep(BESIDE_SECONDS)
        alone = (counted[0] - before) / (time.perf_counter() - began)
        sealer = sealers(1)[0]
        before, began = counted[0], time.perf_counter()
        seal(sealer, megabytes)
        during = (counted[0] - before) / (time.perf_counter() - began)
    finally:
        stop.set()
        counter.join(timeout=10)
    return during / alone


def main() -> None:
    import cryptography

    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=MEGABYTES)
    args = parser.parse_args()
    repeat, megabytes = (1, 128) if args.quick else (args.repeat, args.megabytes)
    seal(sealers(1)[0], 8)  # the cipher's first use out of the figures
    scaling = spread([threads_scaling(megabytes) for _ in range(repeat)])
    progress = spread([beside(megabytes) for _ in range(repeat)])
    rows = [
        ["two threads sealing, against one (>= 1.8)", fmt(scaling), check(scaling, 1.8)],
        ["a Python thread's progress while sealing (>= 0.9)", fmt(progress), check(progress, 0.9)],
    ]
    table = markdown_table(["figure", "median (range)", "target"], rows)
    settings = {
        "cryptography": cryptography.__version__,
        "cipher": bulk_cipher.preferred_cipher(),
        "megabytes": megabytes,
        "repeat": repeat,
        "cores": os.cpu_count(),
    }
    report("aead_threads", table, settings, {"threads": scaling, "beside": progress}, args.out)


if __name__ == "__main__":
    main()
