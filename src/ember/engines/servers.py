"""ServerGroup: S parameter-server processes for one run, their checkpoints and their end."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import safetensors.numpy

from ember.algorithms import make_update_rule
from ember.checkpoint import Checkpoint, free_step, save_checkpoint
from ember.config import RunConfig
from ember.engines.process import reap, start_child, tail
from ember.errors import EmberError, ServerUnavailable
from ember.ps import (
    ParameterServer,
    ShardSpec,
    control,
    fetch_state,
    make_consistency,
    shard_ranges,
)
from ember.ps.server import UpdateRule


class ServerGroup:
    """Starts one process per key-range shard on this machine and talks to them as a whole."""

    def __init__(
        self,
        config: RunConfig,
        initial: np.ndarray,
        secret: bytes,
        log_dir: Path,
        resume: Checkpoint | None = None,
    ) -> None:
        self.config, self.secret, self.log_dir = config, secret, log_dir
        self.initial, self.resume = initial, resume
        self.processes: list[Any] = []
        self.addresses: list[str] = []
        self._last_checkpoint = time.monotonic()
        self._saved_step = -1 if resume is None else int(resume.meta.get("server_step", -1))

    def start(self) -> list[str]:
        rule = make_update_rule(self.config)
        ranges = shard_ranges(self.initial.size, self.config.servers)
        # Children read their starting state from a file rather than from pickled arguments:
        # a large argument can block the launcher writing into a child that died at start-up.
        start_state = self.log_dir / "start-state.safetensors"
        tensors = {"params": self.initial}
        if self.resume is not None:
            tensors.update({k: v for k, v in self.resume.tensors.items() if k in rule.state_names})
        safetensors.numpy.save_file(tensors, str(start_state))
        workers = self.resume.meta.get("workers", {}) if self.resume is not None else {}
        step = int(self.resume.meta.get("server_step", 0)) if self.resume is not None else 0
        pipes = []
        for index, (start, stop) in enumerate(ranges):
            shard = ShardSpec(index, len(ranges), start, stop)
            receiver, sender = _pipe()
            args = (shard, str(start_state), rule, self.config, self.secret, workers, step, sender)
            log = self.log_dir / f"server-{index}.log"
            self.processes.append(start_child(_serve, args, f"ember-server-{index}", log))
            sender.close()  # the child holds the only write end, so its death closes the pipe
            pipes.append((receiver, log))
        for index, (receiver, log) in enumerate(pipes):
            self.addresses.append(self._address_of(index, receiver, log))
        return self.addresses

    def _address_of(self, index: int, receiver: Any, log: Path) -> str:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if receiver.poll(0.5):
                try:
                    return str(receiver.recv())
                except EOFError:
                    break  # the server died before it could say where it listens
            if self.processes[index].exitcode is not None:
                break
        self.stop()
        raise ServerUnavailable(
            f"parameter server {index} did not start (exit code {self.processes[index].exitcode});"
            f" its log ends:\n{tail(log)}"
        )

    def check_alive(self) -> None:
        for index, process in enumerate(self.processes):
            if process.exitcode is not None:
                raise EmberError(
                    f"parameter server {index} exited with code {process.exitcode};"
                    f" its log ends:\n{tail(self.log_dir / f'server-{index}.log')}"
                )

    def checkpoint(self, root: Path, meta: dict[str, Any]) -> Path | None:
        """Save the servers' state named by their update count; None if nothing changed."""
        tensors, state_meta = fetch_state(self.addresses, self.secret, self.config.request_timeout)
        step = int(state_meta["step"])
        if step == self._saved_step:
            return None
        full_meta = {**meta, "server_step": step, "workers": state_meta["workers"]}
        path = save_checkpoint(
            root, free_step(root, step), tensors, full_meta, keep=self.config.keep_checkpoints
        )
        self._saved_step = step
        return path

    def checkpoint_if_due(self, root: Path, meta: dict[str, Any]) -> None:
        """Checkpoint on the configured cadence: every checkpoint_seconds, or every
        checkpoint_steps server updates when that is set."""
        config = self.config
        if time.monotonic() - self._last_checkpoint > config.checkpoint_seconds or (
            config.checkpoint_steps and self.updates_since_checkpoint() >= config.checkpoint_steps
        ):
            self.checkpoint(root, meta)
            self._last_checkpoint = time.monotonic()

    def updates_since_checkpoint(self) -> int:
        """Server updates since the last checkpoint (shard 0 speaks for all: every push
        reaches every shard)."""
        step = int(control(self.addresses[:1], self.secret, "stats")[0]["step"])
        return step - max(self._saved_step, 0)

    def snapshot(self) -> dict[str, np.ndarray]:
        return fetch_state(self.addresses, self.secret, self.config.request_timeout)[0]

    def stats(self) -> list[dict[str, Any]]:
        return control(self.addresses, self.secret, "stats")

    def stop(self) -> list[dict[str, Any]]:
        final: list[dict[str, Any]] = []
        try:
            if self.addresses:
                final = control(self.addresses, self.secret, "stop", timeout=5.0)
        except EmberError:
            pass  # a dead server is reaped below either way
        reap(self.processes)
        return final


def _pipe() -> Any:
    from ember.engines.process import SPAWN

    return SPAWN.Pipe(duplex=False)


def _serve(
    shard: ShardSpec,
    start_state: str,
    rule: UpdateRule,
    config: RunConfig,
    secret: bytes,
    workers: dict[str, Any],
    step: int,
    address_pipe: Any,
) -> None:
    import torch

    with safetensors.safe_open(start_state, framework="np") as saved:
        params = saved.get_slice("params")[shard.start : shard.stop]
        state = {
            k: saved.get_slice(k)[shard.start : shard.stop]
            for k in saved.keys()  # noqa: SIM118 - safe_open is not iterable
            if k in rule.state_names
        }
    torch.set_num_threads(1)
    server = ParameterServer(
        shard,
        params,
        rule,
        make_consistency(config.consistency, config.staleness),
        secret,
        state=state,
        expected_workers=config.workers,
        workers={int(k): v for k, v in workers.items()},
        step=step,
        worker_timeout=config.worker_timeout,
    )
    address_pipe.send(server.address)
    print(
        f"server {shard.index} pid {os.getpid()} serving keys [{shard.start}, {shard.stop}) "
        f"at {server.address}",
        flush=True,
    )
    server.serve()
    print(f"server {shard.index} stopped: {server.stats()}", flush=True)
