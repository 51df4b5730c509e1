"""The codecs of ps/codec.py, their stated bounds, and the error feedback of ps/compress.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from ember import config
from ember.config import make_config
from ember.errors import ConfigError, ProtocolError
from ember.ps.clockrows import MAX_TABLE_ROWS
from ember.ps.codec import BLOCK, CODECS, codec_named
from ember.ps.compress import ShardLink

F32 = np.float32
EPS32 = float(np.finfo(F32).eps)
finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


def _round_trip(kind: str, x: np.ndarray) -> np.ndarray:
    codec = codec_named(kind)
    return codec.decode(codec.encode(x), np.empty_like(x))


@settings(max_examples=200, deadline=None)
@given(
    arrays(F32, st.integers(1, 3 * BLOCK + 7), elements=st.floats(-1, 1, width=32)),
    st.sampled_from([1e-30, 1e-3, 1.0, 1e30]),
)
@example(np.array([1.2494e-41], dtype=F32), 1e-3)  # its scale underflows to zero
@example(np.array([2e-43], dtype=F32), 1.0)  # its scale rounds down: |q| would pass 127
def test_int8_is_within_half_a_scale_of_every_value_per_block(x: np.ndarray, unit: float) -> None:
    """The stated bound: |x - decode(encode(x))| <= s / 2 per block, s = max|x| / 127 of the
    block, up to float32 rounding (of x / s, a few eps of s, and of q * s, an ulp of x)."""
    x = (x * F32(unit)).astype(F32)
    y = _round_trip("int8", x)
    for start in range(0, x.size, BLOCK):
        block, back = x[start : start + BLOCK], y[start : start + BLOCK]
        scale = float(np.abs(block).max() / F32(127))
        bound = scale / 2 * (1 + 4 * EPS32) + np.spacing(np.abs(block))
        assert np.all(np.abs(block.astype(np.float64) - back) <= bound)


@settings(max_examples=200, deadline=None)
@given(arrays(F32, st.integers(1, 500), elements=finite32))
def test_fp16_and_bf16_are_within_their_relative_bounds(x: np.ndarray) -> None:
    """fp16: 2^-11 relative within its range (values beyond 65504 are clipped to it, 2^-25
    absolute among its subnormals); bf16: 2^-8 relative over float32's range (clipped to
    the largest finite bfloat16 rather than rounded to infinity)."""
    inside = np.clip(x, -65504, 65504)
    err16 = np.abs(_round_trip("fp16", x).astype(np.float64) - inside)
    assert np.all(err16 <= np.maximum(np.abs(inside) * 2.0**-11, 2.0**-25))
    err_bf = np.abs(_round_trip("bf16", x).astype(np.float64) - x)
    assert np.all(err_bf <= np.maximum(np.abs(x) * 2.0**-8, 2.0**-133))


def test_bf16_rounds_as_torch_does_and_zeros_decode_exactly() -> None:
    x = np.random.default_rng(0).normal(size=10_000).astype(F32) * 7
    want = torch.from_numpy(x).to(torch.bfloat16).to(torch.float32).numpy()
    np.testing.assert_array_equal(_round_trip("bf16", x), want)
    for kind in CODECS:
        assert not _round_trip(kind, np.zeros(BLOCK + 3, F32)).any()


def test_sizes_and_block_aligned_slices_of_an_encoding() -> None:
    n = 269_322  # the MNIST mlp
    none, fp16, bf16, int8 = (codec_named(kind) for kind in CODECS)
    assert none.encoded_size(n) == 4 * n and fp16.encoded_size(n) == bf16.encoded_size(n) == 2 * n
    assert int8.encoded_size(n) == n + 4 * 66  # 66 blocks, a float32 scale each
    assert 4 * n / int8.encoded_size(n) > 3.99
    x = np.random.default_rng(1).normal(size=3 * BLOCK + 11).astype(F32)
    for codec in (none, fp16, bf16, int8):
        whole = codec.encode(x)
        np.testing.assert_array_equal(codec.encode(x[BLOCK:]), whole[codec.byte_offset(BLOCK) :])
    with pytest.raises(ValueError, match="multiples of 4096"):
        int8.byte_offset(5)
    with pytest.raises(ProtocolError, match="int8 payload of 10 bytes"):
        int8.decode(np.zeros(10, np.uint8), np.empty(10, F32))


def test_every_codec_the_configuration_names_is_one_object_of_that_name() -> None:
    assert [codec_named(kind).name for kind in CODECS] == list(CODECS)
    assert codec_named("int8") is codec_named("int8")  # handed around, never rebuilt
    # config checks a run's `compress` against its own names: ps imports no config
    assert config.CODECS == CODECS
    assert config.MAX_WORKERS == MAX_TABLE_ROWS
    with pytest.raises(ProtocolError, match="codec must be one of none, fp16, bf16, int8"):
        codec_named("int3")


@pytest.mark.parametrize("kind", ["fp16", "bf16", "int8"])
def test_error_feedback_loses_nothing_the_worker_meant_to_send(kind: str) -> None:
    """The oracle: what the server received, summed, plus the residual the worker keeps,
    equals the sum of the gradients it meant to send, to within the float32 rounding of the
    worker's additions g + r (far below one quantization step)."""
    rng = np.random.default_rng(2)
    size, steps = 2 * BLOCK + 100, 300
    codec = codec_named(kind)
    link = ShardLink(codec, size, differences=False)
    meant, received, bound = np.zeros(size), np.zeros(size), np.zeros(size)
    for step in range(steps):
        g = (rng.normal(size=size) * rng.uniform(1e-3, 1) * (1 + step % 7)).astype(F32)
        meant += g
        bound += EPS32 / 2 * np.abs(g.astype(np.float64) + link.residual)  # rounding of g + r
        sent = link.outgoing(g)  # the bytes that cross the socket
        received += codec.decode(sent, np.empty(size, F32))
    assert np.all(np.abs(received + link.residual - meant) <= bound * (1 + 1e-6))
    # what the server received alone misses far more than that: the oracle can fail
    assert np.any(np.abs(received - meant) > 4 * bound)


def test_compress_is_one_clear_config_error_per_bad_value(tmp_path) -> None:
    with pytest.raises(
        ConfigError, match="compress must be one of none, fp16, bf16, int8; got 'int3'"
    ):
        make_config({"compress": "int3"})
    for strategy in ("single", "allreduce"):
        workers = 1 if strategy == "single" else 2
        with pytest.raises(ConfigError, match=f"strategy '{strategy}' has none"):
            make_config({"compress": "int8", "strategy": strategy, "workers": workers})
    path = tmp_path / "run.yaml"
    path.write_text("strategy: bsp\ncompress: bf16\n")
    assert make_config({}, str(path)).compress == "bf16"
    assert make_config({"compress": "fp16"}, str(path)).compress == "fp16"  # flags win


def test_finite_values_never_decode_to_infinity_and_nan_stays_nan() -> None:
    big = np.finfo(F32).max
    x = np.array([65520, -1e5, 3.4e38, -big, np.nan, 1.0], F32)
    half = _round_trip("fp16", x)
    np.testing.assert_array_equal(half[:2], [65504, -65504])
    assert np.isnan(half[4]) and half[5] == 1.0
    brain = _round_trip("bf16", x)
    assert np.all(np.isfinite(brain[[0, 1, 2, 3, 5]])) and np.isnan(brain[4])
    assert np.isnan(_round_trip("int8", np.tile(x, 1000))[:BLOCK]).any()  # the server refuses it
