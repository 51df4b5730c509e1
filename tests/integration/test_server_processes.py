"""ServerGroup's processes: fresh interpreters that take their input on a pipe, listen inside
--ports and on --bind-address, tell workers --advertise-address, and keep their port when
restarted."""

from __future__ import annotations

import os
import random
import re
import socket

import numpy as np
import psutil
import pytest

from ember.config import RunConfig
from ember.engines.process import reap
from ember.engines.servers import SERVER_MODULE, ServerGroup, spare_servers
from ember.ps import control
from tests.conftest import SECRET
from tests.processes import wait_for

pytestmark = pytest.mark.timeout(180)


def free_range(count: int) -> int:
    """The first of `count` consecutive ports nothing listens on right now (bounded tries)."""
    for _ in range(200):
        low = random.randrange(20000, 60000 - count)
        try:
            for port in range(low, low + count):
                with socket.socket() as sock:
                    sock.bind(("0.0.0.0", port))
        except OSError:
            continue
        return low
    raise AssertionError(f"no {count} consecutive free ports found")


def group(tmp_path, **fields) -> ServerGroup:
    config = RunConfig(strategy="async", **fields).validate()
    return ServerGroup(config, np.arange(1000, dtype=np.float32), SECRET, tmp_path)


def test_servers_are_fresh_interpreters_whose_secret_stays_off_the_command_line(tmp_path) -> None:
    servers = group(tmp_path, servers=2)
    try:
        servers.start()
        for process in servers.processes:
            command = psutil.Process(process.pid).cmdline()
            assert command[-2:] == ["-m", SERVER_MODULE]
            assert not any(SECRET.hex() in part or "s" * 32 in part for part in command)
        assert [r["step"] for r in control(servers.primaries, SECRET, "stats")] == [0, 0]
    finally:
        servers.stop()
    assert all(p.exitcode is not None for p in servers.processes)


def test_slots_bind_inside_the_range_advertise_elsewhere_and_keep_their_port(tmp_path) -> None:
    low = free_range(4)
    high = low + 3
    servers = group(
        tmp_path,
        servers=2,
        replicas=2,
        bind_address="0.0.0.0",
        advertise_address="driver-0.example",
        ports=f"{low}-{high}",
    )
    try:
        servers.start()
        slots = [slot for shard in servers.slots for slot in shard]
        assert sorted(slot.port for slot in slots) == [low, low + 1, low + 2, low + 3]
        for slot in slots:
            assert slot.address == f"tcp://driver-0.example:{slot.port}"
            assert slot.local == f"tcp://127.0.0.1:{slot.port}"  # bound to every interface
        log = tmp_path / "server-0.log"
        line = rf"at tcp://0\.0\.0\.0:{slots[0].port}\b"  # written just after it answers
        assert wait_for(lambda: re.search(line, log.read_text()) is not None, 10)
        before = servers.addresses
        victim = servers.slots[1][0]
        victim.process.kill()
        assert wait_for(lambda: victim.process.exitcode is not None, 10)
        servers.keep_alive(tmp_path / "checkpoints")  # promotes its backup, restarts the slot
        assert victim.restarts == 1 and victim.process.is_alive()
        assert sorted(servers.addresses[1].split(",")) == sorted(before[1].split(","))
        assert servers.addresses[1].split(",")[0] != before[1].split(",")[0]  # the backup leads
    finally:
        servers.stop()


def test_spare_servers_take_their_slot_and_log_and_an_unneeded_one_exits(tmp_path) -> None:
    config = RunConfig(strategy="async", servers=2, replicas=2).validate()
    spares = spare_servers(config)
    unneeded = spare_servers(RunConfig(strategy="async").validate())[0]
    started = list(spares)
    servers = ServerGroup(config, np.arange(1000, dtype=np.float32), SECRET, tmp_path, None, spares)
    try:
        servers.start()
        assert spares == []  # all four taken, none spawned besides them
        assert sorted(p.pid for p in servers.processes) == sorted(p.pid for p in started)
        assert [r["step"] for r in control(servers.primaries, SECRET, "stats")] == [0, 0]
        for name in ("server-0", "server-0-replica-1", "server-1", "server-1-replica-1"):
            assert wait_for(
                lambda n=name: "serving keys" in (tmp_path / f"{n}.log").read_text(), 10
            )
        unneeded.send(b"")  # the launcher needed no server after all
        unneeded.join(20)
        assert unneeded.exitcode == 0
    finally:
        servers.stop()
        reap([unneeded])


def test_a_spare_that_died_is_replaced_by_a_fresh_server_with_a_log(tmp_path) -> None:
    config = RunConfig(strategy="async").validate()
    spares = spare_servers(config)
    spares[0].kill()
    spares[0].join(10)
    servers = ServerGroup(config, np.arange(10, dtype=np.float32), SECRET, tmp_path, None, spares)
    try:
        servers.start()
        assert spares == [] and servers.processes[0].is_alive()
        assert [r["step"] for r in control(servers.primaries, SECRET, "stats")] == [0]
    finally:
        servers.stop()


def test_a_launcher_holding_over_a_thousand_descriptors_still_starts_its_servers(
    tmp_path,
) -> None:
    """Its pipes to the servers then take numbers past 1023, which select() refuses."""
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    servers = group(tmp_path, servers=1)
    try:
        servers.start()
        assert [r["step"] for r in control(servers.primaries, SECRET, "stats")] == [0]
    finally:
        servers.stop()
        for fd in held:
            os.close(fd)
