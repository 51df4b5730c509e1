"""ZeroMQ CURVE on every ember connection: keys from the run's secret, the socket options each
end sets, and the ZAP handler that admits only the run's clients.

The keys are derived from the run's 32-byte secret, so they reach every process and Spark task
exactly as the secret does: server key = HMAC-SHA256(secret, "curve-server"), client key =
HMAC-SHA256(secret, "curve-client"), public keys by Curve25519. A peer without the secret
knows neither the server's public key (its CURVE HELLO cannot be opened) nor the client's
secret key (the ZAP handler refuses its public key), so libzmq drops it during the handshake,
before it can get a single message buffered in the server. The HMAC handshake and the sealed
headers stay on top of it (handshake.py), with CURVE and without.

One ZAP handler serves each zmq context (libzmq asks the handler bound at
inproc://zeromq.zap.01 of the server socket's context); it starts with the context's first
encrypted server, answers for every run whose servers live in the process (each server's ZAP
domain names its run's keys), and stops at exit.
"""

from __future__ import annotations

import atexit
import hashlib
import hmac
import os
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache

import zmq
from zmq.utils import z85

from ember.errors import EmberError
from ember.wire.hosts import endpoint_is_local

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # where libzmq looks for a context's handler
ZAP_VERSION = b"1.0"
START_SECONDS = 5.0  # a handler thread that is not listening by then is an error

_encrypt = True  # the process's transport, set once by each entry point of a run
WIRE_CIPHERS = ("curve", "aead")
_wire_cipher = "curve"  # what encrypts when _encrypt is on, set with it


def use_encryption(flag: bool, cipher: str | None = None) -> None:
    """Set whether this process's endpoints and connections are encrypted (the default)
    unless they are told otherwise, and with `cipher` what encrypts them (use_wire_cipher);
    every process of a run sets the run's `encrypt` and `wire_cipher`."""
    global _encrypt
    _encrypt = bool(flag)
    if cipher is not None:
        use_wire_cipher(cipher)


def encrypting(override: bool | None = None) -> bool:
    """`override` when given, else this process's setting."""
    return _encrypt if override is None else bool(override)


def use_wire_cipher(name: str) -> None:
    """Set what encrypts this process's connections when encryption is on: "curve" (libzmq
    encrypts every frame) or "aead" (CURVE off; ember seals the payload chunks, bulk.py)."""
    global _wire_cipher
    _wire_cipher = wire_cipher(name)


def wire_cipher(override: str | None = None) -> str:
    """`override` when given, else this process's wire cipher; checked either way."""
    name = _wire_cipher if override is None else override
    if name not in WIRE_CIPHERS:
        raise ValueError(f"wire cipher must be one of {WIRE_CIPHERS}, not {name!r}")
    return name


@dataclass(frozen=True)
class RunKeys:
    """A run's CURVE keys, Z85-encoded, and the ZAP domain its servers name."""

    server_secret: bytes
    server_public: bytes
    client_secret: bytes
    client_public: bytes

    @property
    def domain(self) -> str:
        # The server's public key names the run (different secrets, different domains)
        # without saying anything a peer could use: CURVE never shows it on the wire.
        return "ember-" + hashlib.sha256(self.server_public).hexdigest()[:32]


@lru_cache(maxsize=64)
def run_keys(secret: bytes) -> RunKeys:
    server = z85.encode(hmac.new(secret, b"curve-server", hashlib.sha256).digest())
    client = z85.encode(hmac.new(secret, b"curve-client", hashlib.sha256).digest())
    return RunKeys(server, zmq.curve_public(server), client, zmq.curve_public(client))


def secure_server(sock: zmq.Socket, secret: bytes, context: zmq.Context) -> str:
    """Make `sock` (not bound yet) a CURVE server that admits only the run's clients; returns
    the ZAP domain to hand release_server when the socket closes."""
    keys = run_keys(secret)
    handler(context).admit(keys.domain, z85.decode(keys.client_public))
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.server_secret)
    sock.setsockopt_string(zmq.ZAP_DOMAIN, keys.domain)
    # Without a handler libzmq would admit every key; with this it admits none instead.
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
    return keys.domain


def release_server(context: zmq.Context, domain: str) -> None:
    handler(context).release(domain)


def secure_client(sock: zmq.Socket, secret: bytes) -> None:
    """Make `sock` (not connected yet) a CURVE client holding the run's keys."""
    keys = run_keys(secret)
    sock.setsockopt(zmq.CURVE_SERVERKEY, keys.server_public)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.client_public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.client_secret)


def warn_if_exposed(
    addresses: Iterable[str],
    encrypt: bool | None = None,
    say: Callable[[str], object] | None = None,
) -> str | None:
    """With the transport plain and a server reachable beyond this host, one warning naming
    the exposure (through `say`, by default to stderr); returns it, or None."""
    exposed = [a for a in addresses if not endpoint_is_local(a)]
    if encrypting(encrypt) or not exposed:
        return None
    warning = (
        f"warning: --encrypt off and the parameter servers listen on {', '.join(exposed)}:"
        " parameters and headers travel in clear, and anyone on that network can read them"
        " and reach the servers"
    )
    (say or (lambda text: print(text, file=sys.stderr, flush=True)))(warning)
    return warning


class ZapHandler:
    """A thread answering libzmq's ZAP requests for one context: a CURVE peer is admitted
    when its public key is the client key of the run its server's domain names."""

    def __init__(self, context: zmq.Context) -> None:
        self._context = context  # held, so the context outlives its handler
        self._lock = threading.Lock()
        self._runs: dict[str, tuple[bytes, int]] = {}  # domain -> (client key, servers)
        self.admitted: Counter[str] = Counter()  # by domain
        self.denied: Counter[str] = Counter()
        self._wake = f"inproc://ember-zap-wake-{os.getpid()}-{id(self)}"
        self._ready = threading.Event()
        self._failure: str | None = None
        self._thread = threading.Thread(target=self._run, name="ember-zap", daemon=True)
        self._thread.start()
        if not self._ready.wait(START_SECONDS) or self._failure is not None:
            reason = self._failure or f"it did not start within {START_SECONDS:g}s"
            raise EmberError(f"cannot start the CURVE authenticator: {reason}")

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def admit(self, domain: str, client_key: bytes) -> None:
        with self._lock:
            _key, servers = self._runs.get(domain, (client_key, 0))
            self._runs[domain] = (client_key, servers + 1)

    def release(self, domain: str) -> None:
        with self._lock:
            key, servers = self._runs.get(domain, (b"", 0))
            if servers > 1:
                self._runs[domain] = (key, servers - 1)
            else:
                self._runs.pop(domain, None)

    def _decide(self, domain: str, mechanism: bytes, credentials: list[bytes]) -> bool:
        if mechanism == b"NULL" and not domain:
            return True  # a server of a run with --encrypt off: its socket names no domain
        with self._lock:
            run = self._runs.get(domain)
        allowed = (
            mechanism == b"CURVE"
            and run is not None
            and len(credentials) == 1
            and hmac.compare_digest(credentials[0], run[0])
        )
        (self.admitted if allowed else self.denied)[domain] += 1
        return allowed

    def _run(self) -> None:
        zap = self._context.socket(zmq.REP)
        wake = self._context.socket(zmq.PAIR)
        try:
            zap.setsockopt(zmq.LINGER, 0)
            wake.setsockopt(zmq.LINGER, 0)
            zap.bind(ZAP_ENDPOINT)
            wake.bind(self._wake)
        except zmq.ZMQError as exc:
            self._failure = f"{ZAP_ENDPOINT}: {exc}"
            zap.close()
            wake.close()
            self._ready.set()
            return
        self._ready.set()
        poller = zmq.Poller()
        poller.register(zap, zmq.POLLIN)
        poller.register(wake, zmq.POLLIN)
        try:
            while wake not in dict(poller.poll()):
                self._answer(zap)
        finally:
            zap.close()
            wake.close()

    def _answer(self, zap: zmq.Socket) -> None:
        request = zap.recv_multipart()
        if len(request) < 6 or request[0] != ZAP_VERSION:
            request_id = request[1] if len(request) > 1 else b""
            zap.send_multipart([ZAP_VERSION, request_id, b"400", b"malformed request", b"", b""])
            return
        _version, request_id, domain, _address, _identity, mechanism = request[:6]
        if self._decide(domain.decode("utf-8", "replace"), mechanism, request[6:]):
            zap.send_multipart([ZAP_VERSION, request_id, b"200", b"OK", b"ember", b""])
        else:
            zap.send_multipart([ZAP_VERSION, request_id, b"400", b"not this run's key", b"", b""])

    def stop(self) -> None:
        if not self.alive:
            return
        wake = self._context.socket(zmq.PAIR)
        try:
            wake.setsockopt(zmq.LINGER, 0)
            wake.connect(self._wake)
            wake.send(b"", zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # the context is terminating: the thread's poll ends with it
        finally:
            wake.close()
        self._thread.join(START_SECONDS)


_handlers: dict[int, ZapHandler] = {}  # id(context) -> its handler; each holds its context
_handlers_lock = threading.Lock()
_handlers_pid = os.getpid()  # a forked child has none of its parent's threads


def handler(context: zmq.Context) -> ZapHandler:
    """The context's ZAP handler, started on first use."""
    global _handlers_pid
    with _handlers_lock:
        if _handlers_pid != os.getpid():
            _handlers.clear()
            _handlers_pid = os.getpid()
        found = _handlers.get(id(context))
        if found is None or not found.alive:
            found = _handlers[id(context)] = ZapHandler(context)
        return found


@atexit.register
def _stop_handlers() -> None:
    with _handlers_lock:
        running = list(_handlers.values()) if _handlers_pid == os.getpid() else []
        _handlers.clear()
    for each in running:
        each.stop()
