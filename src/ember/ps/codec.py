"""Codecs for what crosses the network: float32 vectors as fp16, bf16 or 8-bit bytes (numpy only).

Both ends decode with this same code, so a value decoded by a worker and by a server is the
same float32 bit for bit: views and mirrors kept on both sides of a connection never drift.

int8 layout, block by block of BLOCK values: a float32 scale s = max|x| / 127, then one int8
q = round(x / s) per value (round half to even), decoded as q * s; so |x - decode(x)| <= s / 2
per block. A block of zeros has s = 0 and decodes to zeros. Blocks are independent, so the
bytes of any BLOCK-aligned slice of a vector are a contiguous slice of its encoding.
"""

from __future__ import annotations

import numpy as np

from ember.errors import ProtocolError

__all__ = ["BLOCK", "CODECS", "IDENTITY", "Codec", "codec_named"]
BLOCK = 4096  # int8 values sharing one scale
FP16_MAX = float(np.finfo(np.float16).max)
BF16_MAX = float(np.uint32(0x7F7F0000).view(np.float32))  # the largest finite bfloat16


class Codec:
    """How a float32 vector travels, handed to what compresses (a worker's ShardLink, a
    server's reply), as hivemind hands its averagers a compression. This one is the identity
    ("none"): float32 bytes as they are."""

    name = "none"
    bytes_per_value = 4
    compresses = False  # the identity: what a worker that does not compress sends

    def encoded_size(self, count: int) -> int:
        """Bytes the encoding of `count` float32 values takes."""
        return self.bytes_per_value * count

    def byte_offset(self, start: int) -> int:
        """Where the encoding of the values from `start` on begins."""
        return self.encoded_size(start)

    def encode(self, values: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The bytes (uint8) of 1-D float32 `values`, written into `out` when given."""
        values = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
        size = self.encoded_size(values.size)
        if out is None:
            out = np.empty(size, dtype=np.uint8)
        elif out.dtype != np.uint8 or out.size != size:
            raise ValueError(
                f"{self.name} of {values.size} values needs {size} bytes, got {out.size}"
            )
        self._encode(values, out)
        return out

    def decode(self, data: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Decode the bytes `data` into the caller's 1-D float32 array `out`."""
        data = np.asarray(data).reshape(-1).view(np.uint8)
        wanted = self.encoded_size(out.size)
        if data.size != wanted:
            raise ProtocolError(
                f"{self.name} payload of {data.size} bytes, {out.size} values need {wanted}"
            )
        self._decode(data, out)
        return out

    def _encode(self, values: np.ndarray, out: np.ndarray) -> None:
        out.view(np.float32)[...] = values

    def _decode(self, data: np.ndarray, out: np.ndarray) -> None:
        out[...] = data.view(np.float32)


class Float16(Codec):
    """IEEE half precision, clipped to its largest finite value, not overflowed to inf:
    error feedback carries the excess to later sends."""

    name, bytes_per_value, compresses = "fp16", 2, True

    def _encode(self, values: np.ndarray, out: np.ndarray) -> None:
        if values.size and not np.abs(values).max() <= FP16_MAX:  # rare: one pass to check
            values = np.clip(values, -FP16_MAX, FP16_MAX)
        out.view(np.float16)[...] = values

    def _decode(self, data: np.ndarray, out: np.ndarray) -> None:
        out[...] = data.view(np.float16)


class BFloat16(Codec):
    """The upper 16 bits of float32, rounded to nearest even."""

    name, bytes_per_value, compresses = "bf16", 2, True

    def _encode(self, values: np.ndarray, out: np.ndarray) -> None:
        _encode_bf16(values, out.view(np.uint16))

    def _decode(self, data: np.ndarray, out: np.ndarray) -> None:
        out.view(np.uint32)[...] = data.view(np.uint16).astype(np.uint32) << 16


class Int8(Codec):
    """A float32 scale and one int8 per value, block by block (the module's docstring)."""

    name, compresses = "int8", True

    def encoded_size(self, count: int) -> int:
        return count + 4 * (-(-count // BLOCK))

    def byte_offset(self, start: int) -> int:
        if start % BLOCK:
            raise ValueError(f"int8 slices start at multiples of {BLOCK}, got {start}")
        return self.encoded_size(start)

    def _encode(self, values: np.ndarray, out: np.ndarray) -> None:
        _encode_int8(values, out)

    def _decode(self, data: np.ndarray, out: np.ndarray) -> None:
        _decode_int8(data, out)


IDENTITY = Codec()
_BY_NAME: dict[str, Codec] = {
    codec.name: codec for codec in (IDENTITY, Float16(), BFloat16(), Int8())
}
CODECS = tuple(_BY_NAME)  # a run's `compress` names one (config checks it against these names)


def codec_named(name: object) -> Codec:
    """The codec of a name a run or a request gives (one of CODECS)."""
    codec = _BY_NAME.get(name) if isinstance(name, str) else None
    if codec is None:
        raise ProtocolError(f"codec must be one of {', '.join(CODECS)}; got {name!r}")
    return codec


def _encode_bf16(values: np.ndarray, out: np.ndarray) -> None:
    """The upper 16 bits of float32, rounded to nearest (ties to even) and clipped to the
    largest finite bfloat16; NaN stays NaN."""
    if values.size and not np.abs(values).max() <= BF16_MAX:
        values = np.clip(values, -BF16_MAX, BF16_MAX)  # NaN passes through
    bits = values.view(np.uint32)
    rounded = (bits >> 16) & 1
    rounded += 0x7FFF
    rounded += bits  # wraps only for NaN payloads, put back below
    rounded >>= 16
    out[...] = rounded
    nan = np.isnan(values)
    if nan.any():
        out[nan] = 0x7FC0


def _encode_int8(values: np.ndarray, out: np.ndarray) -> None:
    full = values.size // BLOCK
    body = full * BLOCK
    framed = out[: full * (BLOCK + 4)].reshape(full, BLOCK + 4)
    _int8_rows(values[:body].reshape(full, BLOCK), framed)
    if body < values.size:  # the last, partial block
        tail = values[body:]
        _int8_rows(tail.reshape(1, -1), out[full * (BLOCK + 4) :].reshape(1, -1))


def _int8_rows(rows: np.ndarray, framed: np.ndarray) -> None:
    """Each row of `rows` into the matching row of `framed`: 4 scale bytes, then int8s."""
    largest = np.abs(rows).max(axis=1)
    scales = (largest / np.float32(127)).astype(np.float32)
    # Among subnormals a scale rounds by up to half its own size: one rounded below
    # max|x| / 127 would put |q| past 127 (int8 wraps around), and one rounded to zero would
    # decode the block as zeros. The next float32 up keeps |q| <= 127 and the bound.
    short = scales * np.float32(127) < largest
    scales[short] = np.nextafter(scales[short], np.float32(np.inf))
    safe = np.where(scales > 0, scales, np.float32(1))
    with np.errstate(invalid="ignore"):
        q = np.divide(rows, safe[:, None])
    np.rint(q, out=q)
    if not np.isfinite(scales).all():  # NaN or Inf: the server refuses the decoded block
        np.clip(np.nan_to_num(q, copy=False), -127, 127, out=q)
    framed[:, :4] = scales.reshape(-1, 1).view(np.uint8)
    framed[:, 4:] = q.astype(np.int8).view(np.uint8)  # |q| <= 127 by the choice of the scale


@np.errstate(invalid="ignore")  # a non-finite scale times a zero is NaN: the server refuses it
def _decode_int8(data: np.ndarray, out: np.ndarray) -> None:
    full = out.size // BLOCK
    body = full * BLOCK
    if full:
        framed = data[: full * (BLOCK + 4)].reshape(full, BLOCK + 4)
        scales = np.ascontiguousarray(framed[:, :4]).view(np.float32)
        q = framed[:, 4:].view(np.int8)
        np.multiply(q, scales, out=out[:body].reshape(full, BLOCK), casting="unsafe")
    if body < out.size:
        tail = data[full * (BLOCK + 4) :]
        scale = np.ascontiguousarray(tail[:4]).view(np.float32)
        np.multiply(tail[4:].view(np.int8), scale, out=out[body:], casting="unsafe")
