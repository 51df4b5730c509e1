"""ServerGroup: the parameter-server processes of one run, their replicas, restarts and end.

Each key-range shard has `replicas` slots (processes), each at an address fixed for the run.
One slot is the shard's primary; with two, the other is its backup and takes copies of the
primary's state (see ps/replica.py). The launcher watches the processes: when a primary dies
its backup is promoted, and any dead slot is started again at the same address, from the
newest checkpoint, as the backup of the live slot (or as the primary when none is left).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import safetensors.numpy

from ember.algorithms.rules import make_update_rule
from ember.checkpoint import (
    Checkpoint,
    free_step,
    latest_valid_checkpoint,
    save_checkpoint,
    verify_run_state,
    with_buffers,
)
from ember.config import RunConfig, RunParts, ServerSettings
from ember.engines.addresses import Placement, local_address, placement, port_of
from ember.engines.process import Interpreter, reap, tail
from ember.errors import CheckpointError, EmberError, ServerUnavailable
from ember.ps import ShardSpec, control, fetch_state, shard_ranges
from ember.worker.spec import Layout

SERVER_MODULE = "ember.engines.server_main"  # what each server process runs
START_SECONDS = 60.0  # a server that has not bound its socket by then is not going to
NO_LOG_HINT = "(the log is empty: the server process died before Python could write to it)"


@dataclass
class Slot:
    shard: ShardSpec
    replica: int
    process: Any = None
    port: int | None = None  # fixed once the first process of the slot binds: restarts keep it
    address: str = ""  # what workers are told: tcp://<advertise>:<port>
    local: str = ""  # how this machine reaches it: the launcher's requests, its peer replica
    restarts: int = 0


class ServerGroup:
    """Starts the server processes on this machine and talks to them as a whole."""

    def __init__(
        self,
        config: RunConfig | RunParts,
        initial: np.ndarray,
        secret: bytes,
        log_dir: Path,
        resume: Checkpoint | None = None,
        spares: list[Interpreter] | None = None,
        layout: Layout | None = None,
    ) -> None:
        """`layout` says which keys of `initial` are the model's buffers, which the servers
        fold in as values (rules.py); without it every key is a parameter."""
        parts = config if isinstance(config, RunParts) else RunParts.of(config)
        # its part of the run, the servers' part of that, and of the engine's only the
        # restart budget and where to listen
        self.settings, self.server_settings = parts.servers, ServerSettings.of(parts)
        self.max_restarts = parts.engine.max_restarts
        self.secret, self.log_dir = secret, log_dir
        self.layout = layout if layout is not None else Layout(initial.size)
        self.spares = spares if spares is not None else []  # started early: see spare_servers
        self.initial, self.resume = initial, resume
        self.rule = make_update_rule(self.server_settings)  # its state names: what the servers keep
        self.steps_per_worker = 0
        self.where: Placement = placement(parts.engine)  # the Spark driver sets a cluster's
        self.slots: list[list[Slot]] = []
        self.primary: list[int] = []  # per shard, the replica serving workers
        self.events: list[dict[str, Any]] = []  # promotions and restarts, for the summary
        self._last_checkpoint = time.monotonic()
        self._saved_step = -1 if resume is None else int(resume.meta.get("server_step", -1))

    @property
    def processes(self) -> list[Any]:
        return [slot.process for shard in self.slots for slot in shard]

    @property
    def addresses(self) -> list[str]:
        """What workers are given: per shard, its replicas' addresses, primary first."""
        return [
            ",".join(s.address for s in _primary_first(self, i)) for i in range(len(self.slots))
        ]

    @property
    def primary_slots(self) -> list[Slot]:
        return [shard[p] for shard, p in zip(self.slots, self.primary, strict=True)]

    @property
    def primaries(self) -> list[str]:
        """Where this machine reaches each shard's primary."""
        return [slot.local for slot in self.primary_slots]

    def start(self, steps_per_worker: int = 0) -> list[str]:
        """Start every slot; `steps_per_worker` (the run's optimizer steps on each worker)
        sets the length of a learning-rate schedule, which runs over the servers' commits."""
        self.steps_per_worker = steps_per_worker
        ranges = shard_ranges(self.initial.size, self.settings.servers)
        first_buffer = self.layout.parameters
        shards = [
            ShardSpec(i, len(ranges), a, b, buffers_from=first_buffer)
            for i, (a, b) in enumerate(ranges)
        ]
        self.slots = [[Slot(s, r) for r in range(self.settings.replicas)] for s in shards]
        self.primary = [0] * len(shards)
        tensors = {"params": self.initial}
        if self.resume is not None:
            tensors.update(
                {k: v for k, v in self.resume.tensors.items() if k in self.rule.state_names}
            )
        meta = self.resume.meta if self.resume is not None else {}
        state = self._state_file("start", tensors)
        # Backups first: a primary is told where its backup listens.
        backups = [slot for shard in self.slots for slot in shard[1:]]
        self._launch([(slot, "backup", None) for slot in backups], state, meta)
        primaries = [(shard[0], "primary", _peer(shard, 0)) for shard in self.slots]
        self._launch(primaries, state, meta)
        return self.addresses

    def _launch(
        self, plan: list[tuple[Slot, str, str | None]], state: Path, meta: dict[str, Any]
    ) -> None:
        """Start processes in parallel, then wait for each to say where it listens."""
        workers, step = meta.get("workers", {}), int(meta.get("server_step", 0))
        for slot, role, backup in plan:
            first = slot.shard.index * self.settings.replicas + slot.replica
            message = {
                "parent": os.getpid(),
                "settings": self.server_settings.to_dict(),  # their part alone
                "secret": self.secret,
                "shard": asdict(slot.shard),
                "role": role,
                "backup": backup,
                "bind": self.where.bind,
                "ports": [slot.port] if slot.port is not None else self.where.candidates(first),
                "state": str(state),
                "workers": workers,
                "step": step,
                "pieces": meta.get("pieces"),  # a worker range's data cursor
                "steps_per_worker": self.steps_per_worker,
                "log": str(self._log(slot)),
            }
            packed = msgpack.packb(message)
            spare = self._live_spare()
            if spare is not None:
                spare.name = _name(slot)
                spare.send(packed)
                slot.process = spare
            else:
                slot.process = Interpreter(SERVER_MODULE, packed, _name(slot), self._log(slot))
        for slot, _, _ in plan:
            self._bound(slot, slot.process.readline(START_SECONDS))

    def _live_spare(self) -> Interpreter | None:
        """A spare still running; one that died (its error went to the launcher's stderr, it
        had no log yet) is dropped, and a fresh interpreter with a log takes its place."""
        while self.spares:
            spare = self.spares.pop()
            if spare.is_alive():
                return spare
            spare.join(0)
        return None

    def _bound(self, slot: Slot, answer: str | None) -> None:
        if answer is None or not answer.startswith("tcp://"):
            self.stop()
            raise ServerUnavailable(
                f"parameter server {_name(slot)} did not start (exit code"
                f" {slot.process.exitcode}); its log ends:\n{self._tail(slot)}"
            )
        slot.port, slot.local = port_of(answer), local_address(answer)
        slot.address = self.where.advertised(answer)

    def keep_alive(self, checkpoints: Path) -> None:
        """Promote the backup of a dead primary and start every dead slot again, up to
        max_restarts times each (each noted in `events`); raise when a slot has used them all."""
        for index, shard in enumerate(self.slots):
            dead = [slot for slot in shard if slot.process.exitcode is not None]
            for slot in dead:
                if slot.restarts >= self.max_restarts:
                    raise EmberError(
                        f"parameter server {_name(slot)} exited with code {slot.process.exitcode}"
                        f" ({slot.restarts} restarts allowed by max_restarts used);"
                        f" its log ends:\n{self._tail(slot)}"
                    )
            live = [slot for slot in shard if slot not in dead]
            if not dead:
                continue
            if shard[self.primary[index]] in dead and live:
                try:
                    self._promote(index, live[0], dead[0])
                except ServerUnavailable:  # the backup failed too: restart both
                    dead, live = shard, []
            self._restart(index, dead, checkpoints, primary_needed=not live)

    def _promote(self, index: int, survivor: Slot, dead: Slot) -> None:
        fields = {"backup": dead.local}
        reply = control([survivor.local], self.secret, "promote", fields=fields)[0]
        self.primary[index] = survivor.replica
        copies = reply.get("copies_applied", 0)  # 0: it holds its start checkpoint, no copy
        self._event("promoted", survivor, died=_name(dead), step=reply["step"], copies=copies)

    def _restart(
        self, index: int, dead: list[Slot], checkpoints: Path, primary_needed: bool
    ) -> None:
        saved = latest_valid_checkpoint(checkpoints, verify_run_state)
        if saved is not None:  # the one a resume started from may predate buffers
            saved = with_buffers(saved, self.initial, self.layout.parameters)
        tensors = dict(saved.tensors) if saved is not None else {"params": self.initial}
        meta = saved.meta if saved is not None else {}
        state = self._state_file(f"restart-{index}", tensors)
        plan = []
        for slot in dead:
            reap([slot.process])
            slot.restarts += 1
            role = "primary" if primary_needed and slot is dead[0] else "backup"
            if role == "primary":
                self.primary[index] = slot.replica
            peer = _peer(self.slots[index], slot.replica) if role == "primary" else None
            plan.append((slot, role, peer))
        # A new primary learns its backup's address, so backups start first here too.
        self._launch([p for p in plan if p[1] == "backup"], state, meta)
        self._launch([p for p in plan if p[1] == "primary"], state, meta)
        state.unlink(missing_ok=True)
        for slot, role, _ in plan:
            origin = str(saved.path) if saved is not None else "the initial parameters"
            self._event("restarted", slot, role=role, state_from=origin)

    def _event(self, what: str, slot: Slot, **details: Any) -> None:
        self.events.append(
            {"event": what, "server": _name(slot), "pid": slot.process.pid, **details}
        )

    def checkpoint(
        self, root: Path, meta: dict[str, Any], timeout: float | None = None
    ) -> Path | None:
        """Save the primaries' state named by their update count; None if nothing changed."""
        wait = self.settings.request_timeout if timeout is None else timeout
        tensors, state_meta = fetch_state(self.primaries, self.secret, wait)
        step = int(state_meta["step"])
        if step == self._saved_step:
            return None
        full_meta = {**meta, "server_step": step, "workers": state_meta["workers"]}
        if "pieces" in state_meta:
            full_meta["pieces"] = state_meta["pieces"]
        path = save_checkpoint(
            root, free_step(root, step), tensors, full_meta, keep=self.settings.keep_checkpoints
        )
        self._saved_step = step
        return path

    def checkpoint_if_due(self, root: Path, meta: dict[str, Any]) -> None:
        """Checkpoint on the configured cadence: every checkpoint_seconds, or every
        checkpoint_steps server updates when that is set. A shard failing over meanwhile
        postpones it to the next call; a checkpoint that cannot be written (a full disk) is
        noted in `events` and tried again at the next interval, and training goes on."""
        settings = self.settings
        try:
            if time.monotonic() - self._last_checkpoint > settings.checkpoint_seconds or (
                settings.checkpoint_steps
                and self.updates_since_checkpoint() >= settings.checkpoint_steps
            ):
                self._last_checkpoint = time.monotonic()
                self.checkpoint(root, meta)
        except ServerUnavailable:
            return
        except CheckpointError as exc:
            self.events.append({"event": "checkpoint failed", "error": str(exc)})

    def updates_since_checkpoint(self) -> int:
        """Server updates since the last checkpoint (shard 0 speaks for all: every push
        reaches every shard)."""
        step = int(control(self.primaries[:1], self.secret, "stats")[0]["step"])
        return step - max(self._saved_step, 0)

    def membership(self) -> dict[str, int] | None:
        """Members in now, joins and leaves so far, as shard 0 counts them (every member
        registers with every shard); None while it cannot answer (a failover under way)."""
        try:
            workers = control(self.primaries[:1], self.secret, "stats", timeout=2.0)[0]["workers"]
        except EmberError:
            return None
        return {key: int(workers.get(key, 0)) for key in ("members", "joins", "leaves")}

    def snapshot(self) -> dict[str, np.ndarray]:
        return fetch_state(self.primaries, self.secret, self.settings.request_timeout)[0]

    def stop(self) -> list[dict[str, Any]]:
        """Stop every process; return the primaries' final statistics."""
        final: list[dict[str, Any]] = []
        try:
            if self.slots and all(self.primaries):
                final = control(self.primaries, self.secret, "stop", timeout=5.0)
        except EmberError:
            pass  # a dead server is reaped below either way
        reap(self.processes)
        return final

    def _state_file(self, name: str, tensors: dict[str, np.ndarray]) -> Path:
        # Children read their starting state from a file rather than from pickled arguments:
        # a large argument can block the launcher writing into a child that died at start-up.
        path = self.log_dir / f"{name}-state.safetensors"
        keep = {k: v for k, v in tensors.items() if k == "params" or k in self.rule.state_names}
        safetensors.numpy.save_file(keep, str(path))
        return path

    def _tail(self, slot: Slot) -> str:
        return tail(self._log(slot), hint=NO_LOG_HINT)

    def _log(self, slot: Slot) -> Path:
        return self.log_dir / f"{_name(slot).removeprefix('ember-')}.log"


def spare_servers(config: RunConfig) -> list[Interpreter]:
    """Server interpreters started before the run knows their shards: their imports (most of
    a server's start) then run while the launcher waits for the model's starting parameters,
    and ServerGroup hands each its input when it starts the servers. The caller reaps those
    it did not take."""
    count = config.servers * config.replicas if config.uses_server else 0
    return [Interpreter(SERVER_MODULE, None, "ember-server-spare", None) for _ in range(count)]


def _name(slot: Slot) -> str:
    suffix = "" if slot.replica == 0 else f"-replica-{slot.replica}"
    return f"ember-server-{slot.shard.index}{suffix}"


def _peer(shard: list[Slot], replica: int) -> str | None:
    """Where a primary ships copies of its state: its backup, on this machine."""
    others = [slot.local for slot in shard if slot.replica != replica]
    return others[0] if others else None


def _primary_first(group: ServerGroup, index: int) -> list[Slot]:
    shard = group.slots[index]
    primary = shard[group.primary[index]]
    return [primary] + [slot for slot in shard if slot is not primary]
