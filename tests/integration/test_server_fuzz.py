"""Fuzzing a live ParameterServer: garbage before the handshake, mutated and forged frames after
it, a replayed frame, and non-finite gradients. Every bad input must be refused and counted,
the server must keep serving, and nothing refused may touch the parameters."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ember.algorithms.rules import EASGDRule, SGDRule
from ember.errors import ProtocolError, ServerUnavailable
from ember.ps import PSClient, control, fetch_state
from ember.ps.server import ParameterServer
from ember.ps.shard import BLOCK
from ember.wire import CHUNK_BYTES, ClientConnection, curve
from ember.wire.channel import CHALLENGE, DENIED, HELLO, NONCE_BYTES, PROOF, WELCOME
from ember.wire.frames import DTYPES, frame_sizes, mac, seal, unseal
from tests.conftest import SECRET, running_servers

pytestmark = pytest.mark.timeout(120)

N = 1000  # keys of the fuzzed shard: one chunk
PARAMS = np.linspace(-1, 1, N, dtype=np.float32)
OURS = 1 << 20  # worker ids from here up belong to this file; fuzzed headers never use them
PUSHER = OURS  # registered, so its near-miss pushes get as far as the server's shape checks
SERVER_OPS = {"push", "pull", "register", "done", "snapshot", "stats", "replicate", "promote"}
OBEYED = {"stop", "promote"}  # authenticated orders to stop, or to ship copies to a backup
FUZZ = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
_ids = itertools.count(OURS + 1)  # fresh worker ids for the checks
_seqs = itertools.count(1)  # PUSHER's sequence numbers: a repeated one would be a duplicate ack


@pytest.fixture(scope="module")
def server() -> Iterator[ParameterServer]:
    """One server for every bad-input test; with lr 1 any applied push would show."""
    with running_servers(PARAMS, SGDRule(lr=1.0)) as (server,):
        pusher = PSClient([server.address], SECRET, worker=PUSHER, timeout=5)
        pusher.register()
        pusher.close()
        yield server


def _rejected(address: str) -> dict[str, int]:
    return dict(control([address], SECRET, "stats")[0]["rejected"])


def _assert_serving_and_untouched(address: str) -> None:
    client = PSClient([address], SECRET, worker=next(_ids), timeout=5)
    client.register()
    out = np.empty(N, dtype=np.float32)
    client.pull(out)
    client.close()
    assert out.tobytes() == PARAMS.tobytes()  # bit for bit


# ---- before the handshake ----------------------------------------------------------------------
# Anything but a HELLO (which opens a handshake and is no error); frames shaped like the other
# handshake messages get past the tag split, and PROOF + 32 bytes answers a real challenge.
_raw_frames = st.one_of(
    st.binary(max_size=100),
    st.builds(
        bytes.__add__,
        st.sampled_from([PROOF, CHALLENGE, WELCOME, DENIED, HELLO[:-1]]),
        st.binary(max_size=40) | st.binary(min_size=NONCE_BYTES, max_size=NONCE_BYTES),
    ),
).filter(lambda frame: frame[:-NONCE_BYTES] != HELLO)


def _await(sock: zmq.Socket, tag: bytes) -> None:
    while True:  # skipping DENIED answers to fuzzed proofs
        assert sock.poll(10_000), "the server stopped answering handshakes"
        if sock.recv()[:-NONCE_BYTES] == tag:
            return


def test_random_bytes_before_the_handshake_never_stop_the_server_or_touch_parameters(
    server: ParameterServer,
) -> None:
    before, sent = sum(_rejected(server.address).values()), 0

    @settings(FUZZ, max_examples=500)
    @given(st.booleans(), st.lists(st.lists(_raw_frames, min_size=1, max_size=3), max_size=4))
    def fuzz(half_open: bool, messages: list[list[bytes]]) -> None:
        nonlocal sent
        sock: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        curve.secure_client(sock, SECRET)  # the run's transport keys: the fuzz meets HMAC
        try:
            sock.connect(server.address)
            if half_open:  # the fuzz then lands where the server awaits a PROOF
                sock.send(HELLO + bytes(NONCE_BYTES))
                _await(sock, CHALLENGE)
            for message in messages:
                sock.send_multipart(message)
            if half_open:
                # A connection gets one CHALLENGE, ever: nothing more is answered, so the
                # messages are let go with the socket (LINGER) and counted below instead.
                sock.setsockopt(zmq.LINGER, 5000)
            else:
                # A peer's messages are handled in order: once this HELLO is answered, every
                # fuzzed message was handled and counted (and LINGER 0 can drop none of them).
                sock.send(HELLO + bytes(NONCE_BYTES))
                _await(sock, CHALLENGE)
            sent += len(messages)
        finally:
            sock.close()

    fuzz()
    # Exactly one rejection per message: unauthenticated, or malformed if it has several frames.
    deadline = time.monotonic() + 30
    while sum(_rejected(server.address).values()) - before < sent and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sum(_rejected(server.address).values()) - before == sent
    _assert_serving_and_untouched(server.address)


# ---- after the handshake -----------------------------------------------------------------------
# Bounded sizes keep examples fast; long values in error replies have a test of their own below.
_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8)  # the server accepts no bin at all
    | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=12)),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=6) | st.integers(-(2**63), 2**63), inner, max_size=4)
    ),
    max_leaves=10,
)
_ints = st.integers(-2, 3) | st.integers(-(2**63), 2**64 - 1) | _values
_dims = st.sampled_from([0, 1, N - 1, N, N + 1, 2**31, 2**40 - 1, 2**40, -1]) | _values
_tables = (
    st.lists(
        st.tuples(st.sampled_from([*DTYPES, "float16", ""]) | _values, st.lists(_dims, max_size=9)),
        max_size=4,
    ).map(lambda table: [list(entry) for entry in table])  # msgpack decodes tuples as lists
    | _values
)
_keys = st.just([0, N]) | st.lists(st.sampled_from([0, N, -1, N + 1, 2**63]), max_size=3) | _values
_ops = st.sampled_from([*sorted(SERVER_OPS - OBEYED), "ok", "error"]) | st.text(max_size=8)
_headers = st.builds(
    lambda fields, extra: {**extra, **fields},
    st.fixed_dictionaries(
        {"op": _ops | _values},
        optional={
            **{name: _ints for name in ("worker", "incarnation", "seq", "clock", "step")},
            "keys": _keys,
            "tensors": _tables,
            "pull": _values,
        },
    ),
    st.dictionaries(st.text(max_size=6), _values, max_size=3),
)
_payload = st.lists(st.sampled_from([0, 1, 4, 4 * N - 4, 4 * N, CHUNK_BYTES]), max_size=3)


def _valid_push(header: dict[str, Any]) -> bool:
    """The server's own test: a push for every key carrying one float32[N] tensor."""
    return header.get("keys") == [0, N] and header.get("tensors") == [["float32", [N]]]


def _could_act(header: dict[str, Any]) -> bool:
    """A header sealed with the real key that the server might legitimately obey in a way this
    test cannot allow: stopping, replicating, applying a push, or speaking for this file's own
    workers (or the barrier's op)."""
    worker = header.get("worker")
    return (
        header["op"] in OBEYED
        or header["op"].startswith("fuzz-barrier")
        or (header["op"] == "push" and _valid_push(header))
        or (isinstance(worker, int) and worker >= OURS)
    )


def _push_header(keys: object, table: object, seq: int | None = None) -> dict[str, Any]:
    seq = next(_seqs) if seq is None else seq
    header = {"op": "push", "worker": PUSHER, "incarnation": 0, "seq": seq, "step": 0}
    return {**header, "keys": keys, "tensors": table}


def _case(data: st.DataObject, key: bytes) -> tuple[list[bytes], bool]:
    """One fuzzed request (header frame, payload frames) and whether it must be refused."""
    kind = data.draw(st.sampled_from(["mutated push", "near-miss push", "map", "body"]))
    if kind == "mutated push":  # a valid push header, sealed right, then changed: HMAC fails
        # A fixed seq keeps the frame's length, and so what hypothesis draws, independent of
        # earlier examples; the mutated header never reaches the seq check anyway.
        frame = bytearray(seal(key, _push_header([0, N], [["float32", [N]]], seq=1 << 62)))
        how = data.draw(st.sampled_from(["flip", "truncate", "extend"]))
        if how == "flip":
            frame[data.draw(st.integers(0, len(frame) - 1))] ^= data.draw(st.integers(1, 255))
        elif how == "truncate":
            del frame[data.draw(st.integers(0, len(frame) - 1)) :]
        else:
            frame += data.draw(st.binary(min_size=1, max_size=40))
        header = bytes(frame)
    elif kind == "near-miss push":  # wrong key range or tensor table, from a registered worker
        header = seal(key, _push_header(data.draw(_keys), data.draw(_tables)))
    else:  # a random map, or random bytes, sealed with the session key: authentic garbage
        body = msgpack.packb(data.draw(_headers)) if kind == "map" else data.draw(st.binary())
        header = mac(key, body) + body
    try:
        decoded = unseal(key, header)
        frame_sizes(decoded.get("tensors", []), 1 << 34)
    except ProtocolError:
        refused = True
    else:
        # The real key: the server may obey this. Near-miss pushes are PUSHER's on purpose.
        assume(not (_valid_push(decoded) if kind == "near-miss push" else _could_act(decoded)))
        refused = kind == "near-miss push" or decoded["op"] not in SERVER_OPS | OBEYED
    # Payload of 1.0s: if any of it were applied as a gradient, the parameters would move.
    ones = [np.ones(n // 4, np.float32).tobytes() + bytes(n % 4) for n in data.draw(_payload)]
    return [header, *ones], refused


def test_mutated_and_forged_frames_after_the_handshake_are_refused_and_never_applied(
    server: ParameterServer,
) -> None:
    before, refused = _rejected(server.address), 0

    @settings(FUZZ, max_examples=600)
    @given(st.data())
    def fuzz(data: st.DataObject) -> None:
        nonlocal refused
        connection = ClientConnection(server.address, SECRET, timeout=10)
        try:
            cases = [_case(data, connection._key) for _ in range(data.draw(st.integers(1, 3)))]
            barrier = f"fuzz-barrier-{uuid.uuid4().hex}"
            for frames, certain in [*cases, ([seal(connection._key, {"op": barrier})], True)]:
                # Every payload frame holds a multiple of 4 bytes, so one byte ends whatever
                # stream an earlier header opened (or is refused as a header): each case starts
                # clean, and the barrier is read as a header, refused, and answered last.
                for frame in [b"\x00", *frames]:
                    connection._sock.send(frame)
                refused += 1 + certain
            for _ in range(100):  # replies come in order; the barrier's error is the last
                try:
                    connection.recv(timeout=10)
                except ProtocolError as exc:
                    if barrier in str(exc):
                        break
            else:
                raise AssertionError("the barrier was never answered")
        finally:
            connection.close()

    fuzz()
    after = _rejected(server.address)
    assert sum(after.values()) - sum(before.values()) >= refused
    for reason in ("hmac", "size", "keys", "shape", "request"):
        assert after.get(reason, 0) > before.get(reason, 0), reason
    _assert_serving_and_untouched(server.address)


def test_a_header_replayed_on_another_connection_fails_its_hmac_and_changes_nothing(
    server: ParameterServer,
) -> None:
    first = ClientConnection(server.address, SECRET, timeout=5)
    second = ClientConnection(server.address, SECRET, timeout=5)
    try:
        stats = seal(first._key, {"op": "stats", "seq": 0})
        first._sock.send(stats)
        assert "rejected" in first.recv()[0]  # valid on the connection it was sealed for
        before = _rejected(server.address)
        # Each would act if accepted: answer, stop the server, or apply a gradient of ones.
        push = seal(first._key, _push_header([0, N], [["float32", [N]]]))
        stop = seal(first._key, {"op": "stop", "seq": 0})
        for frame in (stats, stop, push, np.ones(N, np.float32).tobytes()):
            second._sock.send(frame)
        with pytest.raises(ServerUnavailable):
            second.recv(timeout=0.5)  # nothing answers a frame sealed for another session
        after = _rejected(server.address)
        assert after["hmac"] - before.get("hmac", 0) == 4  # the payload is read as a header
    finally:
        first.close()
        second.close()
    _assert_serving_and_untouched(server.address)


def test_an_error_reply_too_long_to_seal_does_not_kill_the_server() -> None:
    with running_servers(PARAMS, SGDRule(lr=1.0)) as (server,):
        connection = ClientConnection(server.address, SECRET, timeout=5)
        try:  # a 30 KB header whose "must be an integer, got [0, 0, ...]" reply is 90 KB
            connection.send({"op": "register", "worker": [0] * 30_000, "incarnation": 0})
            with pytest.raises(ProtocolError, match="must be an integer"):
                connection.recv(timeout=2)
        finally:
            connection.close()
        _assert_serving_and_untouched(server.address)


# ---- non-finite gradients ----------------------------------------------------------------------
CHUNK = CHUNK_BYTES // 4  # float32 keys per payload chunk


@pytest.mark.parametrize("consistency", ["async", "bsp"])  # streamed fold; held round
@pytest.mark.parametrize("rule", [SGDRule(lr=0.5), EASGDRule(alpha=0.5)], ids=["sgd", "easgd"])
@pytest.mark.parametrize("size", [N, 2 * CHUNK + 300], ids=["one-chunk", "three-chunks"])
def test_a_nan_or_inf_chunk_contributes_nothing_is_counted_and_the_server_serves_on(
    consistency: str, rule: SGDRule | EASGDRule, size: int
) -> None:
    """Refused where NaN or Inf is: a push folded as it streams (async) loses the BLOCK keys
    around it, one held for a round (bsp) the chunk, checked before it joins the sum."""
    part = BLOCK if consistency == "async" else CHUNK
    params = np.linspace(-1, 1, size, dtype=np.float32)
    nan_push = np.full(size, 2.0, np.float32)
    nan_push[5] = np.nan  # chunk 0
    inf_push = np.full(size, 2.0, np.float32)
    inf_push[-5] = -np.inf  # the last chunk: the only one if size is one chunk
    clean = np.full(size, 3.0, np.float32)
    # bsp: expected_workers is 0, so the one registered worker completes every round alone.
    with running_servers(params, rule, consistency) as (server,):
        client = PSClient([server.address], SECRET, worker=0, timeout=10)
        client.register()
        model = params.copy()  # what the server must hold: only finite chunks applied
        for values in (nan_push, inf_push, clean):
            reply = np.full(size, np.nan, np.float32)
            client.push(values, reply_into=reply if isinstance(rule, EASGDRule) else None)
            expected_reply = np.zeros(size, np.float32)
            for start in range(0, size, part):
                keys = slice(start, start + part)
                if not np.isfinite(values[keys]).all():
                    continue  # refused: its part of the parameters and of the reply unchanged
                if isinstance(rule, SGDRule):
                    model[keys] -= np.float32(rule.lr) * values[keys]
                else:
                    expected_reply[keys] = (values[keys] - model[keys]) * np.float32(rule.alpha)
                    model[keys] += expected_reply[keys]
            if isinstance(rule, EASGDRule):
                np.testing.assert_array_equal(reply, expected_reply)  # zero where refused
            state, _ = fetch_state([server.address], SECRET)
            assert np.isfinite(state["params"]).all()
            # The scales are powers of two, so the server's float32 arithmetic is exact here.
            np.testing.assert_array_equal(state["params"], model)
        stats = control([server.address], SECRET, "stats")[0]
        client.close()
    assert stats["rejected"] == {"nonfinite": 2}  # one chunk per bad push, nothing else
    assert stats["step"] == 3  # every push, even one wholly refused, is a step that answers
    assert stats["counters"].get("streamed", 0) == (3 if consistency == "async" else 0)


@pytest.mark.parametrize("consistency", ["async", "bsp"])  # streamed fold; held round
@pytest.mark.parametrize(
    "rule",
    [SGDRule(lr=1.0), SGDRule(lr=1.0, momentum=0.5), EASGDRule(alpha=1.0)],
    ids=["sgd", "momentum", "easgd"],
)
def test_finite_pushes_that_would_overflow_a_parameter_are_refused_and_leave_it_as_it_was(
    consistency: str, rule: SGDRule | EASGDRule
) -> None:
    size = 2 * CHUNK + 300
    params = np.zeros(size, np.float32)
    # sgd: 3e38 twice drives a key past float32's max; easgd: two centers of 3e38 and -3e38.
    pushes = [np.full(size, 1.0 + i, np.float32) for i in range(3)]
    pushes[0][CHUNK + 7] = 3e38
    pushes[1][CHUNK + 7] = 3e38 if isinstance(rule, SGDRule) else -3e38
    # Refused: the BLOCK keys around it, where the commit finds the overflow; a round's
    # easgd difference overflows before it joins the round, which refuses its whole chunk.
    whole_chunk = isinstance(rule, EASGDRule) and consistency == "bsp"
    refused = slice(CHUNK, 2 * CHUNK if whole_chunk else CHUNK + BLOCK)
    with running_servers(params, rule, consistency) as (server,):
        client = PSClient([server.address], SECRET, worker=0, timeout=10)
        client.register()
        held = []
        for values in pushes:
            reply = np.full(size, np.nan, np.float32)
            client.push(values, reply_into=reply if isinstance(rule, EASGDRule) else None)
            state, _ = fetch_state([server.address], SECRET)
            held.append(state)
            if isinstance(rule, EASGDRule) and values is pushes[1]:
                assert not reply[refused].any()  # the refused part's reply is a step not taken
        stats = control([server.address], SECRET, "stats")[0]
        client.close()
    for state in held:
        assert all(np.isfinite(value).all() for value in state.values())
    for name in held[0]:  # the refused push left that part, and only it, as it was
        np.testing.assert_array_equal(held[1][name][refused], held[0][name][refused])
        assert not np.array_equal(held[1][name][:CHUNK], held[0][name][:CHUNK])
        if not whole_chunk:
            rest = slice(refused.stop, 2 * CHUNK)
            assert not np.array_equal(held[1][name][rest], held[0][name][rest])
    # with momentum the buffer still carries 1.5e38 into the third push, which overflows too
    overflows = 2 if isinstance(rule, SGDRule) and rule.momentum else 1
    assert stats["rejected"] == {"nonfinite": overflows}
