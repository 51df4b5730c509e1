"""A raw CURVE client (ZMTP 3 with CurveZMQ, RFC 26) over a plain TCP socket, holding the run's
keys: a worker that sends what libzmq never would, such as a multipart message that never ends.
The boxes are libsodium's (the one pyzmq ships, or the system's), through ctypes."""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import socket
from pathlib import Path

import zmq
from zmq.utils import z85

from ember.wire import curve


def _sodium() -> ctypes.CDLL:
    bundled = Path(zmq.__file__).parent.parent / "pyzmq.libs"
    found = sorted(glob.glob(str(bundled / "libsodium*.so*"))) or [
        ctypes.util.find_library("sodium")
    ]
    library = ctypes.CDLL(found[0])
    if library.sodium_init() < 0:
        raise OSError("libsodium did not start")
    return library


_nacl = _sodium()


def _box(message: bytes, nonce: bytes, public: bytes, secret: bytes) -> bytes:
    out = ctypes.create_string_buffer(len(message) + 16)
    if _nacl.crypto_box_easy(out, message, ctypes.c_ulonglong(len(message)), nonce, public, secret):
        raise ValueError("crypto_box_easy failed")
    return out.raw


def _open(box: bytes, nonce: bytes, public: bytes, secret: bytes) -> bytes:
    out = ctypes.create_string_buffer(max(1, len(box) - 16))
    if _nacl.crypto_box_open_easy(out, box, ctypes.c_ulonglong(len(box)), nonce, public, secret):
        raise ValueError("a box from the server did not open")
    return out.raw[: len(box) - 16]


def _keypair() -> tuple[bytes, bytes]:
    public, secret = ctypes.create_string_buffer(32), ctypes.create_string_buffer(32)
    _nacl.crypto_box_keypair(public, secret)
    return public.raw, secret.raw


def recv_exact(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        more = sock.recv(count - len(data))
        if not more:
            raise ConnectionResetError("the server closed the connection")
        data += more
    return data


def _frame(flags: int, body: bytes) -> bytes:
    if len(body) > 255:
        return bytes([flags | 0x02]) + len(body).to_bytes(8, "big") + body
    return bytes([flags, len(body)]) + body


def read_frame(sock: socket.socket) -> tuple[int, bytes]:
    """One ZMTP frame: (flags, body)."""
    flags = recv_exact(sock, 1)[0]
    size = int.from_bytes(recv_exact(sock, 8 if flags & 0x02 else 1), "big")
    return flags, recv_exact(sock, size)


class CurvePeer:
    """A connected DEALER speaking CURVE by hand with the run's client keys."""

    def __init__(self, address: str, secret: bytes, timeout: float = 10.0) -> None:
        keys = curve.run_keys(secret)
        server = z85.decode(keys.server_public)
        client, client_secret = z85.decode(keys.client_public), z85.decode(keys.client_secret)
        host, port = address.removeprefix("tcp://").rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self._nonce = 0
        greeting = b"\xff" + bytes(8) + b"\x7f\x03\x00" + b"CURVE".ljust(20, b"\0") + bytes(32)
        self.sock.sendall(greeting)
        recv_exact(self.sock, 64)
        self._public, self._secret = _keypair()  # this connection's transient keys
        short = self._next()
        hello_box = _box(bytes(64), b"CurveZMQHELLO---" + short, server, self._secret)
        hello = b"\x05HELLO\x01\x00" + bytes(72) + self._public + short + hello_box
        self.sock.sendall(_frame(0x04, hello))
        welcome = read_frame(self.sock)[1]
        assert welcome.startswith(b"\x07WELCOME"), welcome[:16]
        opened = _open(welcome[24:], b"WELCOME-" + welcome[8:24], server, self._secret)
        self._server, cookie = opened[:32], opened[32:128]
        vouch_nonce = os.urandom(16)
        vouch = _box(self._public + server, b"VOUCH---" + vouch_nonce, self._server, client_secret)
        metadata = b"\x0bSocket-Type" + (6).to_bytes(4, "big") + b"DEALER"
        short = self._next()
        plain = client + vouch_nonce + vouch + metadata
        initiate_box = _box(plain, b"CurveZMQINITIATE" + short, self._server, self._secret)
        self.sock.sendall(_frame(0x04, b"\x08INITIATE" + cookie + short + initiate_box))
        ready = read_frame(self.sock)[1]
        assert ready.startswith(b"\x05READY"), ready[:16]

    def _next(self) -> bytes:
        self._nonce += 1
        return self._nonce.to_bytes(8, "big")

    def send(self, data: bytes, more: bool = False) -> None:
        """One frame of a message, encrypted; with `more`, more frames of it follow."""
        short = self._next()
        box = _box(
            bytes([int(more)]) + data, b"CurveZMQMESSAGEC" + short, self._server, self._secret
        )
        self.sock.sendall(_frame(0x00, b"\x07MESSAGE" + short + box))

    def recv(self) -> bytes:
        """The next frame the server sends, decrypted."""
        body = read_frame(self.sock)[1]
        assert body.startswith(b"\x07MESSAGE"), body[:16]
        nonce = b"CurveZMQMESSAGES" + body[8:16]
        return _open(body[16:], nonce, self._server, self._secret)[1:]

    def close(self) -> None:
        self.sock.close()
