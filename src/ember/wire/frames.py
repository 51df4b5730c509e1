"""Message framing: HMAC-sealed msgpack headers and raw tensor chunk frames (no zmq here)."""

from __future__ import annotations

import hashlib
import hmac
import math
from collections.abc import Iterator, Sequence
from typing import Any

import msgpack
import numpy as np

from ember.errors import ProtocolError

MAC_BYTES = 32  # HMAC-SHA256 digest length
MAX_HEADER_BYTES = 64 * 1024
MAX_REPLY_BYTES = 1 << 36  # replies come from an authenticated server; this only bounds a bug
# Tensors travel in frames of at most 1 MiB. The frame is what pipelines: a server folds and
# answers frame k while k + 1 is on the wire, and CURVE encrypts and decrypts whole frames, so
# a 4 MB push in one 8 MiB frame crossed a link store-and-forward (encrypt, send, decrypt, then
# the same back). On an emulated 1 Gbit link, 1M floats each way went from 0.72 to 0.96 Gbit/s
# encrypted, and from 0.94x to 1.16x gloo plain, when frames went from 8 MiB to 1 MiB; 512 KiB
# did as well there but cost more per frame on loopback (lab/benchmarks/cluster.py, exchange.py).
CHUNK_BYTES = 1 << 20
DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "int64": np.dtype(np.int64),
    "int32": np.dtype(np.int32),
    "uint8": np.dtype(np.uint8),  # encoded payloads (ps/codec.py)
}


def mac(key: bytes, *parts: bytes) -> bytes:
    digest = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        digest.update(part)
    return digest.digest()


def seal(key: bytes, header: dict[str, Any]) -> bytes:
    """Header frame = HMAC-SHA256(key, body) || msgpack(body)."""
    body = msgpack.packb(header, use_bin_type=True)
    if len(body) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(body)} bytes exceeds the {MAX_HEADER_BYTES} limit")
    return mac(key, body) + body


def unseal(key: bytes, frame: bytes | memoryview) -> dict[str, Any]:
    """Check the MAC before parsing anything, then decode a msgpack map with bounded sizes."""
    data = bytes(frame)
    if not MAC_BYTES < len(data) <= MAC_BYTES + MAX_HEADER_BYTES:
        raise ProtocolError(f"header frame of {len(data)} bytes is outside the allowed size")
    body = data[MAC_BYTES:]
    if not hmac.compare_digest(data[:MAC_BYTES], mac(key, body)):
        raise ProtocolError("header HMAC does not match")
    try:
        header = msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=True,
            max_bin_len=0,
            max_array_len=65536,
            max_map_len=65536,
            max_str_len=4096,
        )
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise ProtocolError(f"header is not valid msgpack: {exc}") from exc
    if not isinstance(header, dict) or not isinstance(header.get("op"), str):
        raise ProtocolError("header must be a map with a string 'op'")
    return header


def describe(arrays: Sequence[np.ndarray]) -> list[list[Any]]:
    """The header's tensor table: [dtype name, shape] per tensor."""
    return [[a.dtype.name, list(a.shape)] for a in arrays]


def chunk_frames(arrays: Sequence[np.ndarray]) -> Iterator[memoryview]:
    """Yield each tensor's bytes as views of at most CHUNK_BYTES; nothing is copied."""
    for array in arrays:
        if not array.flags.c_contiguous:
            raise ProtocolError("tensors must be C-contiguous to be sent without a copy")
        flat = memoryview(array.reshape(-1).view(np.uint8).data)
        if flat.nbytes == 0:
            yield flat
        for start in range(0, flat.nbytes, CHUNK_BYTES):
            yield flat[start : start + CHUNK_BYTES]


def expected_chunks(table: object, max_bytes: int) -> list[tuple[np.dtype, tuple[int, ...], int]]:
    """Validate a header's tensor table before any payload is touched.

    Returns (dtype, shape, nbytes) per tensor. The total declared size must fit `max_bytes`, so
    a header cannot make the receiver trust a payload larger than it is willing to hold.
    """
    if not isinstance(table, list) or len(table) > 64:
        raise ProtocolError("tensor table must be a list of at most 64 [dtype, shape] entries")
    out: list[tuple[np.dtype, tuple[int, ...], int]] = []
    total = 0
    for entry in table:
        if not (
            isinstance(entry, list)
            and len(entry) == 2
            and isinstance(entry[0], str)  # a list or map here is unhashable: `in` would raise
            and entry[0] in DTYPES
            and isinstance(entry[1], list)
            and len(entry[1]) <= 8
            and all(isinstance(d, int) and 0 <= d < 2**40 for d in entry[1])
        ):
            raise ProtocolError(f"bad tensor entry {entry!r}: want [dtype, shape]")
        dtype, shape = DTYPES[entry[0]], tuple(entry[1])
        nbytes = math.prod(shape) * dtype.itemsize  # Python ints: no overflow to wrap around
        total += nbytes
        if total > max_bytes:
            raise ProtocolError(f"declared payload exceeds the {max_bytes}-byte limit")
        out.append((dtype, shape, nbytes))
    return out


def frame_sizes(table: object, max_bytes: int) -> list[int]:
    """The byte size of every payload frame a header's tensor table announces, in order."""
    sizes = []
    for _dtype, _shape, nbytes in expected_chunks(table, max_bytes):
        sizes.extend([min(CHUNK_BYTES, nbytes - s) for s in range(0, nbytes, CHUNK_BYTES)] or [0])
    return sizes


def tensors_from_frames(
    table: object, frames: Sequence[Any], max_bytes: int
) -> list[list[np.ndarray]]:
    """Map payload frames to per-tensor lists of 1-D chunk views, checking every frame length.

    The views alias the frames' buffers (zero-copy): they are valid while the frames are alive.
    """
    layout = expected_chunks(table, max_bytes)
    tensors: list[list[np.ndarray]] = []
    index = 0
    for dtype, _shape, nbytes in layout:
        chunks = []
        sizes = [min(CHUNK_BYTES, nbytes - s) for s in range(0, nbytes, CHUNK_BYTES)] or [0]
        for size in sizes:
            if index >= len(frames):
                raise ProtocolError(f"payload has {len(frames)} frames, header declares more")
            buffer = memoryview(
                frames[index].buffer if hasattr(frames[index], "buffer") else frames[index]
            )
            if buffer.nbytes != size:
                raise ProtocolError(
                    f"payload frame {index} has {buffer.nbytes} bytes, header declares {size}"
                )
            chunks.append(np.frombuffer(buffer, dtype=dtype))
            index += 1
        tensors.append(chunks)
    if index != len(frames):
        raise ProtocolError(f"payload has {len(frames)} frames, header declares {index}")
    return tensors


def same_place(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays are the same bytes of memory (a copy between them would be a no-op)."""
    return bool(
        a.nbytes == b.nbytes
        and a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
    )


def gather(chunks: Sequence[np.ndarray], out: np.ndarray) -> np.ndarray:
    """Copy chunk views into `out` (1-D) in order: the one copy into the caller's own storage."""
    offset = 0
    for chunk in chunks:
        target = out[offset : offset + chunk.size]
        if not same_place(chunk, target):  # a reply read in place from shared memory
            target[...] = chunk
        offset += chunk.size
    if offset != out.size:
        raise ProtocolError(f"received {offset} elements, expected {out.size}")
    return out
