"""The transport on 127.0.0.1: CURVE keeps every peer without the run's keys out of a server
before libzmq buffers a byte of its messages, a wrong secret fails fast, and runs train with
encryption on and off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from ember.algorithms.rules import SGDRule
from ember.errors import ProtocolError
from ember.ps import control
from ember.wire import ClientConnection, curve, shared
from tests.conftest import SECRET, running_servers, transport
from tests.rogue_peers import attack, hello_flood

pytestmark = pytest.mark.timeout(180)

MiB = 1 << 20
ATTACK_BYTES = 256 * MiB  # what the raw peer sends without ever finishing its message
GROWTH_LIMIT = 64 * MiB


def test_an_unfinished_message_from_a_peer_without_the_keys_is_never_buffered() -> None:
    growth, sent, dropped = attack(True, SECRET, ATTACK_BYTES)
    assert dropped, f"the server kept a peer without the keys after {sent} bytes"
    assert growth < GROWTH_LIMIT, f"server grew {growth / MiB:.0f} MiB while a peer sent {sent}"


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_hello_flood_of_2000_peers_locks_out_none_of_5_workers() -> None:
    keys = curve.run_keys(SECRET)
    context = zmq.Context.instance()
    zap = curve.handler(context)
    peers, wave = 2000, 100
    descriptors_before = open_descriptors()
    with running_servers(np.zeros(16, dtype=np.float32), SGDRule(lr=1.0)) as (server,):
        denied_before = zap.denied[keys.domain]
        opened: list[str] = []
        failures: list[str] = []
        flooding = threading.Event()

        def workers() -> None:
            flooding.wait(30)
            for _ in range(5):
                try:
                    ClientConnection(server.address, SECRET, timeout=10).close()
                    opened.append("ok")
                except Exception as exc:
                    failures.append(repr(exc))

        legitimate = threading.Thread(target=workers)
        legitimate.start()
        try:
            hello_flood(
                context,
                server.address,
                keys.server_public,
                peers,
                wave,
                lambda: zap.denied[keys.domain],
                flooding.set,
            )
        finally:
            legitimate.join(60)
        assert failures == []
        assert opened == ["ok"] * 5
        assert zap.denied[keys.domain] - denied_before == peers  # each refused at the handshake
        stats = control([server.address], SECRET, "stats")[0]
        assert stats["rejected"].get("unauthenticated", 0) == 0  # no HELLO reached ember
        assert stats["encrypted"] is True
    # The server looks up each accepted connection's address by its descriptor, which libzmq
    # may have closed and reused by then: none of those lookups may leave a descriptor open.
    deadline = time.monotonic() + 10  # libzmq reaps the flood's closed sockets in its own time
    while open_descriptors() > descriptors_before + 20 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert open_descriptors() <= descriptors_before + 20, "the flood left descriptors open"


def test_a_wrong_secret_is_a_clear_error_long_before_the_timeout() -> None:
    with running_servers(np.zeros(4, dtype=np.float32), SGDRule(lr=1.0)) as (server,):
        # A ProtocolError, not the ServerUnavailable that waiting out the timeout raises.
        with pytest.raises(ProtocolError, match="refused the run's secret"):
            ClientConnection(server.address, b"w" * 32, timeout=30, watch=True)
        with pytest.raises(ProtocolError, match="refused the run's secret"):
            ClientConnection(server.address, b"w" * 32, timeout=30)


@pytest.mark.parametrize("server_encrypts", [True, False])
def test_a_client_with_the_other_encrypt_setting_is_told_so(server_encrypts: bool) -> None:
    with (
        transport(server_encrypts),
        running_servers(np.zeros(4, dtype=np.float32), SGDRule(lr=1.0)) as (server,),
        pytest.raises(ProtocolError, match="speaks another transport"),
    ):
        ClientConnection(server.address, SECRET, timeout=30, encrypt=not server_encrypts)


TRAIN = [sys.executable, "-m", "ember", "train", "--data", "digits", "--epochs", "1"]
TRAIN += ["--strategy", "easgd-async", "--workers", "2"]


def ember_train(out: Path, *flags: str, env: dict[str, str] | None = None) -> dict:
    done = subprocess.run(
        [*TRAIN, "--out", str(out), *flags],
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize(("encrypt", "shared_memory"), [("on", "1"), ("off", "1"), ("on", "0")])
def test_runs_train_encrypted_and_not_and_say_how_their_payloads_travelled(
    tmp_path: Path, encrypt: str, shared_memory: str
) -> None:
    summary = ember_train(
        tmp_path / "run", "--encrypt", encrypt, env={shared.DISABLE_VARIABLE: shared_memory}
    )
    assert summary["config"]["encrypt"] is (encrypt == "on")
    assert summary["wire"]["encrypted"] is (encrypt == "on")
    if shared_memory == "1":
        assert summary["wire"]["shared_memory_payloads"] > 0  # same host, through loopback
    else:
        assert summary["wire"]["shared_memory_payloads"] == 0
    assert summary["test_accuracy"] > 0.8
