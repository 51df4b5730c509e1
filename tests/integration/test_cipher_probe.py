"""`ember plan`'s measure of what encrypting the wire costs: ember's own exchange through a
server process, every payload on the loopback socket, in plaintext and under each cipher."""

from __future__ import annotations

import os

import pytest

from ember.config import RunConfig
from ember.wire import curve, shared
from ember_lab.bench.cipher_probe import cipher_cpu_per_byte


@pytest.mark.parametrize("cipher", ["curve", "aead"])
def test_the_probe_measures_sealing_and_opening_and_leaves_the_process_as_it_was(
    cipher: str,
) -> None:
    before = (curve.encrypting(), curve.wire_cipher(), os.environ.get(shared.DISABLE_VARIABLE))
    per_byte = cipher_cpu_per_byte(RunConfig(), cipher, repeat=1)
    # CURVE and AES-GCM on any CPU of the last decade: between 50 MB/s and 50 GB/s a core
    assert 1 / 50e9 < per_byte < 1 / 50e6
    after = (curve.encrypting(), curve.wire_cipher(), os.environ.get(shared.DISABLE_VARIABLE))
    assert after == before


def test_the_wire_figures_time_each_wire_side_by_side() -> None:
    """ember bench's wire table: plaintext, CURVE and aead, each a real exchange."""
    from ember_lab.bench.cipher_probe import WIRES, wire_figures

    figures = wire_figures(RunConfig(), 200_000, repeat=1)
    assert list(figures) == list(WIRES)
    assert figures["plaintext"]["vs_plaintext"] == 1.0
    for name, figure in figures.items():
        assert figure["gbit"] > 0.05, name  # 1.6 MB a round trip, even on a busy machine
        assert figure["client_cpu_ms"] > 0 and figure["server_cpu_ms"] > 0, name
        assert figure["vs_plaintext"] == figure["gbit"] / figures["plaintext"]["gbit"]
