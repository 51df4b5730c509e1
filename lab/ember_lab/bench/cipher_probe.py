"""What encrypting the wire costs here, per byte, for `ember plan`'s predictions across hosts.

On one host a worker's payloads go through shared memory and only the headers are encrypted,
so the calibration measures no cipher on them; across hosts every payload byte is sealed by
its sender and opened by its receiver. This probe times ember's own exchange (a PSClient and
a server process, as calibrate.py does) with every payload on the loopback socket, once in
plaintext and once under the wire cipher: both ends' CPU of the encrypted exchanges less that
of the plain ones, over the bytes moved, is what sealing and opening a byte costs (libzmq's
I/O threads included, for CURVE).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from ember.config import RunConfig
from ember.probe import curve, shared, use_encryption
from ember_lab.bench.calibrate import exchange_figures

FLOATS = 2_000_000  # 8 MB each way an exchange: chunks enough to pipeline, quick to move
EXCHANGES = 8
# `ember bench`'s wire table: (encrypt, wire_cipher) of each wire, plaintext first
WIRES = {"plaintext": (False, "curve"), "curve": (True, "curve"), "aead": (True, "aead")}


def cipher_cpu_per_byte(config: RunConfig, cipher: str, repeat: int = 3) -> float:
    """CPU seconds that sealing and opening one byte take, both ends together, under wire
    cipher `cipher` ("curve" or "aead"): the median of `repeat` interleaved measurements."""
    if cipher not in curve.WIRE_CIPHERS:
        raise ValueError(f"wire cipher {cipher!r}: choose {' or '.join(curve.WIRE_CIPHERS)}")
    params = np.zeros(FLOATS, np.float32)
    moved = 2 * params.nbytes * EXCHANGES
    added = []
    for _ in range(max(1, repeat)):
        plain = _both_ends(RunConfig(**{**config.to_dict(), "encrypt": False}), params)
        sealed = _both_ends(RunConfig(**{**config.to_dict(), "wire_cipher": cipher}), params)
        added.append(max(0.0, sealed - plain) * EXCHANGES / moved)
    return statistics.median(added)


def wire_figures(config: RunConfig, floats: int, repeat: int = 3) -> dict[str, dict[str, float]]:
    """Each of WIRES' push + pull of `floats` floats over the loopback socket (shared memory
    off, as between hosts), medians of `repeat` rounds, the order rotated each round: Gbit/s
    of both directions' bytes, that against plaintext's, and the client's and the server's
    CPU milliseconds per exchange."""
    params = np.zeros(max(1, floats), np.float32)
    names = list(WIRES)
    measured: dict[str, list[tuple[float, float, float]]] = {name: [] for name in names}
    for index in range(max(1, repeat)):
        for name in names[index % len(names) :] + names[: index % len(names)]:
            encrypt, cipher = WIRES[name]
            wire = RunConfig(**{**config.to_dict(), "encrypt": encrypt, "wire_cipher": cipher})
            with _over_the_socket(wire):
                measured[name].append(exchange_figures(wire, params, EXCHANGES))
    figures = {}
    for name, runs in measured.items():
        wall, client, server = (statistics.median(run[i] for run in runs) for i in range(3))
        figures[name] = {
            "gbit": 2 * params.nbytes * 8 / wall / 1e9,
            "client_cpu_ms": client * 1e3,
            "server_cpu_ms": server * 1e3,
        }
    for figure in figures.values():
        figure["vs_plaintext"] = figure["gbit"] / figures["plaintext"]["gbit"]
    return figures


def _both_ends(config: RunConfig, params: np.ndarray) -> float:
    """Client and server CPU seconds of one exchange of `params`, over the socket."""
    with _over_the_socket(config):
        _, client_cpu, server_cpu = exchange_figures(config, params, EXCHANGES)
    return client_cpu + server_cpu


@contextmanager
def _over_the_socket(config: RunConfig) -> Iterator[None]:
    """This process's wire as `config` says, no shared memory, for the duration."""
    kept = os.environ.get(shared.DISABLE_VARIABLE)
    os.environ[shared.DISABLE_VARIABLE] = "0"  # the server processes inherit it too
    encrypting, cipher = curve.encrypting(), curve.wire_cipher()
    use_encryption(config.encrypt, config.wire_cipher)
    try:
        yield
    finally:
        use_encryption(encrypting, cipher)
        if kept is None:
            os.environ.pop(shared.DISABLE_VARIABLE, None)
        else:
            os.environ[shared.DISABLE_VARIABLE] = kept
