"""The syntax of the address fields (--bind-address, --advertise-address, --ports), checked
before anything starts (leaf module: imports only ember.errors)."""

from __future__ import annotations

import re

from ember.errors import ConfigError

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
# Host names (RFC 1123 labels) and IPv4 addresses, which zmq's tcp transport binds and
# connects to as they are; IPv6 would need zmq.IPV6 set on every socket of the run.
_HOST = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*")
_RANGE = re.compile(r"\s*(\d{1,5})\s*-\s*(\d{1,5})\s*")


def check_host(name: str, host: str | None) -> None:
    if host is not None and not _HOST.fullmatch(host):
        raise ConfigError(
            f"{name} must be a host name or an IPv4 address, without a scheme or a port"
            f" (ports go in --ports); got {host!r}"
        )


def port_range(text: str, slots: int = 0, collector: bool = False) -> tuple[int, int]:
    """`text` ("LO-HI") as (LO, HI), both included; a ConfigError when it is malformed or
    holds fewer ports than `slots` server processes (and the record `collector`) listen on."""
    match = _RANGE.fullmatch(text)
    low, high = (int(match[1]), int(match[2])) if match else (0, 0)
    if not 1 <= low <= high <= 65535:
        raise ConfigError(
            f"ports must be LO-HI with 1 <= LO <= HI <= 65535, e.g. 7100-7199; got {text!r}"
        )
    needed = slots + int(collector)
    if high - low + 1 < needed:
        also = " and the Spark record collector" if collector else ""
        raise ConfigError(
            f"ports {text} holds {high - low + 1} port(s), but the run listens on {needed}:"
            f" {slots} parameter-server process(es) (servers x replicas){also}; widen the range"
        )
    return low, high
