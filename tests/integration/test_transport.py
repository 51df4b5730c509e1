"""The transport on 127.0.0.1: CURVE keeps every peer without the run's keys out of a server
before libzmq buffers a byte of its messages, a wrong secret fails fast, and runs train with
encryption on and off."""

from __future__ import annotations

import contextlib
import json
import os
import socket
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
from tests.conftest import SECRET, endpoint_process, running_servers, transport

pytestmark = pytest.mark.timeout(180)

MiB = 1 << 20
ATTACK_BYTES = 256 * MiB  # what the raw peer sends without ever finishing its message
ATTACK_SECONDS = 60.0
GROWTH_LIMIT = 64 * MiB
FRAME_BYTES = MiB  # under the sockets' largest frame, so zmq buffers each one whole


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def _greeting(mechanism: bytes) -> bytes:
    """A ZMTP 3.0 greeting: signature, version 3.0, mechanism, as-server 0, filler."""
    return b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + mechanism.ljust(20, b"\0") + bytes(32)


def _ready(socket_type: bytes) -> bytes:
    """The NULL mechanism's READY command, naming the peer's socket type."""
    name = b"Socket-Type"
    body = b"\x05READY" + bytes([len(name)]) + name + len(socket_type).to_bytes(4, "big")
    body += socket_type
    return b"\x04" + bytes([len(body)]) + body


def unfinished_message(address: str, total: int, on_frame: object = None) -> tuple[int, bool]:
    """Speak ZMTP 3 by hand as a DEALER with the NULL mechanism, then send `total` bytes of
    one multipart message whose frames all carry MORE, so it never ends: a pyzmq sender
    could not, since it drains its own messages. Returns (bytes sent, whether the server
    dropped the connection). Bounded by `total` and ATTACK_SECONDS."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    deadline = time.monotonic() + ATTACK_SECONDS
    payload = bytes(FRAME_BYTES)
    frame = b"\x03" + FRAME_BYTES.to_bytes(8, "big") + payload  # MORE | LONG
    sent = 0
    with socket.create_connection((host, int(port)), timeout=10) as peer:
        try:
            peer.sendall(_greeting(b"NULL"))
            if len(peer.recv(64)) == 0:
                return sent, True
            peer.sendall(_ready(b"DEALER"))
            while sent < total and time.monotonic() < deadline:
                peer.sendall(frame)
                sent += FRAME_BYTES
                if callable(on_frame):
                    on_frame(sent)
        except (BrokenPipeError, ConnectionResetError):
            return sent, True
        except TimeoutError:
            return sent, False  # the server neither reads nor closes: it holds what it has
        # Sent everything: dropped only if the server has closed its end by now.
        peer.settimeout(2.0)
        try:
            return sent, peer.recv(4096) == b""
        except TimeoutError:
            return sent, False
        except ConnectionResetError:
            return sent, True


def attack(encrypt: bool) -> tuple[int, int, bool]:
    """(server RSS growth, bytes sent, dropped) for one unfinished message of ATTACK_BYTES."""
    with endpoint_process(encrypt) as (pid, address):
        time.sleep(0.5)  # imports settled: what grows now is the peer's doing
        before = peak = rss(pid)

        def watch(_sent: int) -> None:
            nonlocal peak
            peak = max(peak, rss(pid))

        sent, dropped = unfinished_message(address, ATTACK_BYTES, watch)
        time.sleep(0.5)
        peak = max(peak, rss(pid))
        return peak - before, sent, dropped


def test_an_unfinished_message_from_a_peer_without_the_keys_is_never_buffered() -> None:
    growth, sent, dropped = attack(encrypt=True)
    assert dropped, f"the server kept a peer without the keys after {sent} bytes"
    assert growth < GROWTH_LIMIT, f"server grew {growth / MiB:.0f} MiB while a peer sent {sent}"


def _flood_peer(context: zmq.Context, server_key: bytes) -> zmq.Socket:
    """A peer that knows the server's public key (more than one without the secret could)
    but holds a key pair of its own, and says the HMAC HELLO."""
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    public, secret = zmq.curve_keypair()
    sock.setsockopt(zmq.CURVE_SERVERKEY, server_key)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
    return sock


def test_a_hello_flood_of_2000_peers_locks_out_none_of_5_workers() -> None:
    keys = curve.run_keys(SECRET)
    context = zmq.Context.instance()
    zap = curve.handler(context)
    peers, wave = 2000, 100
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
            for start in range(0, peers, wave):
                socks = [_flood_peer(context, keys.server_public) for _ in range(wave)]
                for sock in socks:
                    sock.connect(server.address)
                    # The HELLO waits for a handshake that ZAP refuses; a pipe libzmq has not
                    # made yet takes nothing, and the connection is refused all the same.
                    with contextlib.suppress(zmq.Again):
                        sock.send(b"EMBER2-HELLO" + os.urandom(32), zmq.NOBLOCK)
                flooding.set()
                target = denied_before + start + wave
                deadline = time.monotonic() + 30
                while zap.denied[keys.domain] < target and time.monotonic() < deadline:
                    time.sleep(0.01)
                for sock in socks:
                    sock.close(linger=0)
        finally:
            legitimate.join(60)
        assert failures == []
        assert opened == ["ok"] * 5
        assert zap.denied[keys.domain] - denied_before == peers  # each refused at the handshake
        stats = control([server.address], SECRET, "stats")[0]
        assert stats["rejected"].get("unauthenticated", 0) == 0  # no HELLO reached ember
        assert stats["encrypted"] is True


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
