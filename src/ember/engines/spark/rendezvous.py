"""`allreduce` on Spark: the barrier tasks meet for torch.distributed (gloo) without a server.

Rank 0's task opens a TCPStore on its own executor's host (the first free port of --ports, when
given) and tells the other tasks its address through BarrierTaskContext.allGather, as
TorchDistributor and XGBoost's Spark integration do. Each task then checks that it reaches that
port before gloo starts, so an unreachable rank 0 is one line naming the task's host and the
address it tried, not a wait of --request-timeout. At the end rank 0 hands its final parameters
back as one record: raw float32 bytes in base64 inside the task's JSON rows, never a pickle.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import os
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from ember.checkpoint import latest_valid_checkpoint
from ember.config import RunConfig
from ember.config.network import port_range
from ember.engines.addresses import LOOPBACK, Placement
from ember.engines.spark.gather import StoreAddress, all_gather
from ember.metrics.records import FinalState

PROBE_SECONDS = 5.0  # rank 0's store, listening already, answers a connection at once
INTERFACE = "GLOO_SOCKET_IFNAME"  # the interface gloo binds: the one towards rank 0


@dataclass
class Meeting:
    """Where this task's process group meets: rank 0's store address, and this task's store
    (the server on rank 0, a client elsewhere, None until connected)."""

    host: str
    port: int
    store: Any = None
    error: str | None = None  # rank 0 could not open its store: why, for every task to say

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def meet(context: Any, ports: str | None, timeout: float, local: bool) -> Meeting:
    """Rank 0 opens its store on one of --ports and every task learns where (one allGather).
    On a local master rank 0's host is 127.0.0.1; on a cluster, its executor's host as Spark
    knows it, the address the other executors already reach it at. `timeout`: the run's
    --request-timeout, how long a store waits for its peers."""
    import torch.distributed as dist

    host = LOOPBACK if local else context.getTaskInfos()[0].address.rsplit(":", 1)[0]
    said, store = StoreAddress(), None
    if context.partitionId() == 0:
        store, said = _open_store(host, ports, timeout, len(context.getTaskInfos()), dist)
    told: StoreAddress = all_gather(context, said)[0]
    return Meeting(host, told.port, store, told.error)


def _open_store(
    host: str, ports: str | None, timeout: float, world: int, dist: Any
) -> tuple[Any, StoreAddress]:
    """Rank 0's TCPStore on the first free port of --ports (after the record collector's, which
    shares the range on a local master), or on one the kernel picks."""
    allowed = port_range(ports) if ports else None
    candidates = Placement(ports=allowed).candidates(first=1)
    wait = datetime.timedelta(seconds=timeout)
    for port in candidates:
        try:
            store = dist.TCPStore(
                host, port, world, is_master=True, timeout=wait, wait_for_workers=False
            )
            return store, StoreAddress(port=int(store.port))
        except dist.DistNetworkError as exc:
            if "EADDRINUSE" not in str(exc) or port == candidates[-1]:
                where = f"any port of --ports {ports}" if ports else "a port"
                return None, StoreAddress(
                    error=f"rank 0 of allreduce on {socket.gethostname()} ({host}) could not"
                    f" listen on {where} for the gloo rendezvous: {str(exc).splitlines()[0]};"
                    " widen --ports or free some"
                )
    raise AssertionError("a store needs at least one port to try")


def reach(meeting: Meeting, rank: int, seconds: float = PROBE_SECONDS) -> str | None:
    """None when this task reaches rank 0's store within `seconds` (rank 0 itself does); else
    the one line saying from where it tried what, and what to check."""
    if meeting.error is not None:
        return meeting.error
    if rank == 0:
        return None
    try:
        socket.create_connection((meeting.host, meeting.port), timeout=seconds).close()
        return None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if isinstance(exc, TimeoutError | socket.timeout):
            reason = f"no answer within {seconds:g}s"
    own = own_address(meeting.host, meeting.port)
    return (
        f"the training task on {socket.gethostname()} ({own}) cannot reach allreduce's rank 0"
        f" (its gloo rendezvous) at {meeting.host} port {meeting.port}: {reason}. Check that"
        " no firewall between the executors drops the port, and --ports"
    )


def connect(meeting: Meeting, timeout: float, world: int) -> None:
    """A rank other than 0: its client of rank 0's store, waiting up to `timeout` seconds (the
    run's --request-timeout)."""
    import torch.distributed as dist

    if meeting.store is None:
        wait = datetime.timedelta(seconds=timeout)
        meeting.store = dist.TCPStore(
            meeting.host, meeting.port, world, is_master=False, timeout=wait
        )


@contextlib.contextmanager
def gloo_interface(meeting: Meeting) -> Iterator[None]:
    """gloo binds the interface its host name resolves to, which on a cluster may be loopback
    (one name for many hosts, or 127.0.1.1 in /etc/hosts): it is told the interface on this
    host's route to rank 0 instead, unless the executor's environment names one already."""
    if os.environ.get(INTERFACE):
        yield
        return
    name = interface_of(own_address(meeting.host, meeting.port))
    if name is not None:
        os.environ[INTERFACE] = name
    try:
        yield
    finally:  # Spark reuses its Python workers: the next task may meet elsewhere
        os.environ.pop(INTERFACE, None)


def own_address(host: str, port: int) -> str:
    """This host's address on the route towards `host` (a UDP connect sends nothing)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, port))
            return str(probe.getsockname()[0])
    except OSError:
        return "address unknown"


def interface_of(address: str) -> str | None:
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == address for a in addresses):
            return name
    return None


def scratch() -> tempfile.TemporaryDirectory[str]:
    """The folder an allreduce task's worker saves its final parameters in on the executor,
    removed with the task: the driver's run directory is on another machine."""
    return tempfile.TemporaryDirectory(prefix="ember-allreduce-")


def final_state(folder: str, meeting: Meeting) -> FinalState:
    """Rank 0's record of its final parameters (all ranks hold the same), read back from the
    checkpoint its worker saved in `folder`."""
    last = latest_valid_checkpoint(Path(folder) / "checkpoints")
    if last is None:
        raise RuntimeError(f"allreduce's rank 0 saved no final parameters in {folder}")
    params = np.ascontiguousarray(last.tensors["params"], dtype=np.float32)
    return FinalState(
        rendezvous=meeting.address,
        step=int(last.meta.get("step", 0)),
        size=int(params.size),
        params=base64.b64encode(params.tobytes()).decode("ascii"),
    )


def state_params(state: FinalState, size: int) -> np.ndarray:
    """The parameters of a final state, checked against the model's `size`."""
    params = np.frombuffer(base64.b64decode(state.params or "", validate=True), dtype=np.float32)
    if params.size != size:
        raise RuntimeError(
            f"allreduce's rank 0 returned {params.size} parameters; the model has {size}"
        )
    return params.copy()  # writable, as a loaded checkpoint's


def exposure(config: RunConfig, cluster: bool) -> str | None:
    """The warning for gloo's traffic when it may leave this host: gloo neither encrypts nor
    authenticates, whatever --encrypt says about ember's own connections."""
    if not cluster:
        return None
    covered = (
        "--encrypt on covers ember's own connections only"
        if config.encrypt
        else "--encrypt off: ember's own connections are plain too"
    )
    return (
        "warning: allreduce on a Spark cluster: the gradients travel between the executors"
        f" through gloo (torch.distributed), which neither encrypts nor authenticates ({covered}):"
        " anyone on that network can read them and reach rank 0's rendezvous port"
    )
