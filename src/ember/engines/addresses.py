"""Where a run's sockets listen and what workers are told: --bind-address, --advertise-address
and --ports resolved, and a listener bound to the first free port of the range.

Defaults: on this machine (the local engine, `local*` Spark masters) 127.0.0.1 for both, as
every process is here. On a cluster master the servers bind spark.driver.bindAddress, else
0.0.0.0, and advertise spark.driver.host: what Spark itself tells its executors.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ember.config import EnginePart, RunConfig
from ember.config.network import port_range
from ember.errors import ConfigError, EmberError

LOOPBACK = "127.0.0.1"
ANYWHERE = "0.0.0.0"
T = TypeVar("T")


@dataclass(frozen=True)
class Placement:
    bind: str = LOOPBACK  # host or address the listeners bind
    advertise: str = LOOPBACK  # host or address workers connect to
    ports: tuple[int, int] | None = None  # (low, high) both included; None: any free port

    def candidates(self, first: int = 0) -> list[int]:
        """The ports a new listener tries, in order (0: one the kernel picks). Listener k of a
        run starts at the range's k-th port, so those starting at once rarely collide."""
        if self.ports is None:
            return [0]
        ports = list(range(self.ports[0], self.ports[1] + 1))
        first %= len(ports)
        return ports[first:] + ports[:first]

    def advertised(self, bound: str) -> str:
        """The address workers are given for a listener bound at `bound` (tcp://ip:port)."""
        return f"tcp://{self.advertise}:{port_of(bound)}"

    def describe(self) -> dict[str, object]:
        ports = None if self.ports is None else f"{self.ports[0]}-{self.ports[1]}"
        return {"bind_address": self.bind, "advertise_address": self.advertise, "ports": ports}


def placement(
    config: RunConfig | EnginePart,
    cluster: bool = False,
    setting: Callable[[str], str | None] | None = None,
) -> Placement:
    """The run's placement: explicit fields first, then the defaults for where it runs.
    `cluster` is a master whose executors may be on other machines; `setting` reads the
    running SparkSession's configuration."""
    if not cluster:
        bind = config.bind_address or LOOPBACK
        advertise = config.advertise_address or LOOPBACK
    else:
        look = setting or (lambda _: None)
        bind = config.bind_address or look("spark.driver.bindAddress") or ANYWHERE
        found = config.advertise_address or look("spark.driver.host")
        if not found:
            raise ConfigError(
                "no address to tell the Spark executors the parameter servers are at:"
                " spark.driver.host is unset; pass --advertise-address"
            )
        advertise = found
    return Placement(bind, advertise, port_range(config.ports) if config.ports else None)


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def local_address(bound: str) -> str:
    """How a process on this machine reaches a listener bound at `bound`: its own address,
    or loopback for one bound to every interface."""
    host, port = bound.removeprefix("tcp://").rsplit(":", 1)
    return f"tcp://{LOOPBACK if host in (ANYWHERE, '*') else host}:{port}"


def bind_first(open_at: Callable[[str], T], host: str, ports: list[int], what: str) -> T:
    """`open_at("tcp://host:port")` for the first of `ports` that is free. A port in use moves
    on to the next: the listeners of a run start at once and share the range."""
    for port in ports:
        try:
            return open_at(f"tcp://{host}:{port}")
        except Exception as exc:  # zmq.ZMQError, which only ember.wire may import
            in_use = getattr(exc, "errno", None) == errno.EADDRINUSE
            if not in_use or port != ports[-1]:
                if in_use:
                    continue
                raise
            if len(ports) == 1:
                raise
            raise EmberError(
                f"{what}: every port of --ports {min(ports)}-{max(ports)} on {host} is in use;"
                " widen the range or free some"
            ) from exc
    raise AssertionError("a listener needs at least one port to try")
