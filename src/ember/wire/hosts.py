"""Which addresses stay on this host: loopback TCP, and transports that never leave it."""

from __future__ import annotations

import ipaddress

LOCAL_NAMES = ("localhost",)
LOCAL_TRANSPORTS = ("ipc://", "inproc://")  # a path or a process: never another machine


def host_of(endpoint: str) -> str:
    """The host part of a zmq endpoint: "127.0.0.1" for tcp://127.0.0.1:5555, "::1" for
    tcp://[::1]:5555, "" for one that names no host (ipc, inproc)."""
    if endpoint.startswith(LOCAL_TRANSPORTS):
        return ""
    rest = endpoint.split("://", 1)[-1]
    if rest.startswith("["):
        return rest[1 : rest.find("]")] if "]" in rest else rest[1:]
    host, _, _port = rest.rpartition(":")
    return host or rest


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or a name; an IPv4-mapped IPv6 address counts as IPv4) is
    this host's loopback: 127.0.0.0/8, ::1 or localhost. Any other name is not, since only
    an address proves where the peer is."""
    host = host.strip().strip("[]").lower()
    if host in LOCAL_NAMES:
        return True
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return bool((mapped or address).is_loopback)


def endpoint_is_local(endpoint: str) -> bool:
    """Whether a connection to `endpoint` cannot leave this host."""
    return endpoint.startswith(LOCAL_TRANSPORTS) or is_loopback(host_of(endpoint))
