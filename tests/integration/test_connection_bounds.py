"""What a connection may make a server hold, before and after it authenticates: a CURVE
handshake command of a frame's size, idle connections past the open-file limit, an unfinished
multipart message from a peer holding the secret, a flood of ember HELLOs, and sessions of
connections that close right after their handshake. Real peers on 127.0.0.1, each loop
bounded in count and time."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import psutil
import pytest
import zmq

from ember.wire import ClientConnection, peers
from ember.wire.endpoint import ServerEndpoint
from ember.wire.frames import mac
from ember.wire.handshake import CHALLENGE, HELLO, NONCE_BYTES, PROOF, WELCOME
from ember.wire.sessions import CLOSING_SECONDS
from tests.conftest import SECRET, endpoint_process
from tests.rogue_peers import (
    MiB,
    Polling,
    attack,
    hold_handshakes,
    idle_greeter,
    keyed_socket,
    open_session_by_hand,
)
from tests.rogue_peers import endpoint_process as limited_endpoint_process


@pytest.fixture(autouse=True)
def quiet_cores() -> Iterator[None]:
    """The memory bounds depend on the server's scan keeping up with a peer that sends as
    fast as loopback takes it: start each attack once what the tests before left running
    (a cluster's JVMs shutting down, say) has let the cores go, waiting 30 s at most."""
    deadline = time.monotonic() + 30
    while psutil.cpu_percent(interval=0.5) > 50 and time.monotonic() < deadline:
        pass
    yield


pytestmark = pytest.mark.timeout(180)


def test_peers_holding_a_frame_sized_curve_handshake_command_are_dropped_before_it_costs() -> None:
    with endpoint_process(encrypt=True) as (pid, address):
        growth, held, gone = hold_handshakes(pid, address, 64)  # 64 MiB sent in all
    assert growth < 24 * MiB, f"+{growth / MiB:.0f} MiB for {held} MiB sent"
    assert gone == held, f"{held - gone} of {held} still held"


def test_idle_greeters_past_the_open_file_limit_leave_room_for_a_worker_to_connect() -> None:
    greeters = []
    # 256 descriptors: the greeters alone would take them all, as 1,088 take 1,024
    with limited_endpoint_process(True, SECRET, open_files=256) as (_pid, address):
        try:
            for _ in range(300):
                greeters.append(idle_greeter(address))
            time.sleep(2)  # the server sees each of them
            ClientConnection(address, SECRET, timeout=15).close()  # its handshake completes
        finally:
            for greeter in greeters:
                greeter.close()


@pytest.mark.parametrize("encrypt", [True, False], ids=["curve", "plain"])
def test_a_keyed_peer_that_never_finishes_a_message_is_dropped_before_it_costs(
    encrypt: bool,
) -> None:
    growth, sent, was_dropped = attack(encrypt, SECRET, total=256 * MiB, keyed=True)
    assert was_dropped, f"{sent // MiB} MiB sent and held"
    # UNSEEN_BYTES (24 MiB), then what loopback delivers until the next scan: about 20 MiB
    # each 10 ms at its 2 GB/s, and on a busy host a scan can come a few periods late
    assert growth < 96 * MiB, f"+{growth / MiB:.0f} MiB after {sent // MiB} MiB sent"


def test_a_keyed_hello_flood_neither_evicts_a_pending_handshake_nor_queues_replies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the flood is slow to set up on a busy host: the legit handshake may wait for it
    monkeypatch.setattr(peers, "HANDSHAKE_SECONDS", 120.0, raising=False)
    endpoint = ServerEndpoint(SECRET, encrypt=False)  # ember's own handshake is what is flooded
    polling = Polling(endpoint)
    context = zmq.Context()
    context.set(zmq.MAX_SOCKETS, 4096)  # the flood's sockets, beyond a context's default
    legit = keyed_socket(context, SECRET, encrypt=False)
    flood: list[zmq.Socket] = []
    try:
        legit.connect(endpoint.address)
        client_nonce = bytes(NONCE_BYTES)
        legit.send(HELLO + client_nonce)
        assert legit.poll(10_000)
        nonces = legit.recv()[-NONCE_BYTES:] + client_nonce
        for _ in range(1100):  # more peers than the server ever kept pending handshakes of
            sock = keyed_socket(context, SECRET, encrypt=False)
            sock.connect(endpoint.address)
            for _ in range(3):
                sock.send(HELLO + bytes(NONCE_BYTES))
            flood.append(sock)
        deadline = time.monotonic() + 60
        answered = [0] * len(flood)
        while time.monotonic() < deadline and not all(answered):
            for index, sock in enumerate(flood):
                while sock.poll(0):
                    assert sock.recv().startswith(CHALLENGE)
                    answered[index] += 1
            time.sleep(0.05)
        legit.send(PROOF + mac(SECRET, b"proof", nonces))
        assert legit.poll(10_000), "the pending handshake was forgotten"
        assert legit.recv().startswith(WELCOME)
        time.sleep(1)
        for index, sock in enumerate(flood):
            while sock.poll(0):
                sock.recv()
                answered[index] += 1
        assert sorted(set(answered)) == [1], "a connection gets one CHALLENGE, however often asked"
    finally:
        polling.stop()
        legit.close()
        for sock in flood:
            sock.close()
        context.term()
        endpoint.close()


@pytest.mark.parametrize("encrypt", [True, False], ids=["curve", "plain"])
def test_sessions_of_connections_closed_right_after_their_handshake_are_dropped(
    encrypt: bool,
) -> None:
    endpoint = ServerEndpoint(SECRET, encrypt=encrypt)
    polling = Polling(endpoint)
    context = zmq.Context.instance()
    try:
        for _ in range(150):  # a keyed peer that opens a session, says nothing, and leaves
            sock = keyed_socket(context, SECRET, encrypt)
            with contextlib.closing(sock):
                sock.connect(endpoint.address)
                open_session_by_hand(sock, SECRET)
        for _ in range(150):  # an ordinary client closed at once
            ClientConnection(endpoint.address, SECRET, timeout=10, encrypt=encrypt).close()
        deadline = time.monotonic() + CLOSING_SECONDS + 20
        while endpoint.peer_state["sessions"] and time.monotonic() < deadline:
            polling.take(0.2)
        state = endpoint.peer_state
    finally:
        polling.stop()
        endpoint.close()
    assert state["sessions"] == state.get("handshaking", 0) == state["accepted"] == 0, state
