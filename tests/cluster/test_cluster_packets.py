"""The capture on the switch and the search for a secret's bytes in it."""

from __future__ import annotations

import random

import pytest

from ember_lab.emulated.links import block, transfer
from tests.cluster.packets import Capture, shares_window

SECRET = random.Random(1).randbytes(4096)


@pytest.mark.parametrize("offset", [0, 1, 7, 31, 33, 1000, 4096 - 64])
def test_a_64_byte_window_is_found_at_any_offset_in_a_frame(offset) -> None:
    window = SECRET[offset : offset + 64]
    frame = random.Random(2).randbytes(37) + window + random.Random(3).randbytes(50)
    assert shares_window(iter([frame]), SECRET)


def test_63_bytes_are_not_a_window_and_other_bytes_match_nothing() -> None:
    short = random.Random(2).randbytes(40) + SECRET[100:163] + random.Random(3).randbytes(40)
    noise = random.Random(4).randbytes(1 << 16)
    assert not shares_window(iter([short, noise]), SECRET)
    assert not shares_window(iter([SECRET[:32] + SECRET[64:96]]), SECRET)  # two runs, apart


def test_zero_filler_in_the_secret_matches_no_padding() -> None:
    secret = bytes(256) + SECRET[:256]
    assert not shares_window(iter([bytes(2048)]), secret)
    assert shares_window(iter([bytes(8) + secret[256:320]]), secret)


@pytest.mark.timeout(300)
def test_a_capture_on_the_switch_holds_what_crossed_it(cluster, tmp_path) -> None:
    with Capture(cluster, tmp_path / "frames", seconds=60, max_bytes=64 << 20) as capture:
        transfer(cluster, 1, 2, 4 << 20, seed=5)
    assert shares_window(capture.frames(), block(5))
    assert not shares_window(capture.frames(), block(6))
