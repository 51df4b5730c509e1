"""`python -m ember.engines.server_main`: one parameter-server process, as ServerGroup starts
it. A fresh interpreter rather than a spawned child, so it never imports the user's
`__main__`: a top-level spark-submit script works. Its input is one msgpack map on stdin
(never the command line: the run's secret is in it); it answers the address it bound, one
line on stdout, then serves; what it prints goes to its log, the stderr it was given.

It never imports torch (the server's arithmetic is NumPy's): that import was most of the
seconds a server took to start; tests/unit/test_server_imports.py holds it to that."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import msgpack
import safetensors

from ember.algorithms.rules import make_update_rule
from ember.config import ServerSettings
from ember.engines.addresses import bind_first
from ember.engines.process import _die_with_parent
from ember.ps import ParameterServer, ShardSpec, make_consistency
from ember.ps.pieces import parse_cursor
from ember.wire import server_io_threads, use_encryption, use_io_threads


def main() -> None:
    # Ctrl-C is the launcher's to handle (a last checkpoint first); it stops servers itself
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    data = sys.stdin.buffer.read()  # until the launcher closes the pipe
    if not data:  # a spare the launcher did not need (servers.py: spare_servers)
        raise SystemExit(0)
    message = msgpack.unpackb(data)
    _die_with_parent(message["parent"])
    log = os.open(message["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 2)  # its own log, also when it started as a spare writing to the launcher's
    os.close(log)
    answer = os.dup(1)
    os.dup2(2, 1)  # from here on what the server prints goes to its log
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the process's own

    def tell(address: str) -> None:
        os.write(answer, f"{address}\n".encode())
        os.close(answer)

    serve(message, tell)


def serve(message: dict[str, Any], tell: Callable[[str], None]) -> None:
    config = ServerSettings.from_dict(message["settings"])  # the run's servers' part alone
    # every socket of this process, before the first opens: its transport and I/O threads
    use_encryption(config.encrypt, config.wire_cipher)
    use_io_threads(server_io_threads())
    shard, role = ShardSpec(**message["shard"]), message["role"]
    # rebuilt here: ps never imports the algorithms
    rule = make_update_rule(config, message.get("steps_per_worker", 0))
    with safetensors.safe_open(message["state"], framework="np") as saved:
        params = saved.get_slice("params")[shard.start : shard.stop]
        state = {
            k: saved.get_slice(k)[shard.start : shard.stop]
            for k in saved.keys()  # noqa: SIM118 - safe_open is not iterable
            if k in rule.state_names
        }

    saved = message.get("pieces")
    cursor = parse_cursor(saved) if saved is not None else None

    def listen(bind: str) -> ParameterServer:
        return ParameterServer(
            shard,
            params,
            rule,
            make_consistency(config.consistency, config.staleness),
            message["secret"],
            bind=bind,
            state=state,
            expected_workers=config.workers,
            workers={int(k): v for k, v in message["workers"].items()},
            step=message["step"],
            worker_timeout=config.worker_timeout,
            max_workers=config.max_workers,
            members_max=config.workers_max,
            role=role,
            backup=message["backup"],
            replica_seconds=config.replica_seconds,
            cursor=cursor,
        )

    name = f"parameter server {shard.index} ({role})"
    server = bind_first(listen, message["bind"], message["ports"], name)
    tell(server.address)
    print(
        f"server {shard.index} ({role}) pid {os.getpid()} serving keys"
        f" [{shard.start}, {shard.stop}) at {server.address}",
        flush=True,
    )
    server.serve()
    print(f"server {shard.index} stopped: {server.stats()}", flush=True)


if __name__ == "__main__":
    main()
