"""Where a run's seconds and memory go: its phases, timed, and the peak memory of its processes."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable
from typing import Any

# What the summary's phases mean, in the order a run goes through them; "launch" is only
# there when this process is the `ember` command, whose start-up is then part of the run.
PHASES = {
    "launch": "interpreter, imports and configuration, up to the engine's start",
    "data": "loading and decoding the data, and laying it out for the workers",
    "model": "the model's starting parameters (a local run: once the fork server has torch)",
    "servers": "starting the parameter servers, until each listens",
    "workers": "starting the workers, until each reports its first step is next",
    "training": "from the first worker's start to the last worker's end",
    "checkpoint": "the servers' final checkpoint, and stopping them",
    "evaluation": "evaluating the final parameters and writing the summary",
    "teardown": "reaping the processes and removing the run's data copy",
}
STARTUP = ("launch", "data", "model", "servers", "workers")
TEARDOWN = ("checkpoint", "evaluation", "teardown")


class Timeline:
    """Marks the start of each phase; a phase lasts until the next one starts."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, float]] = []
        launched = seconds_since_launch()
        if launched is not None:
            self.marks.append(("launch", time.perf_counter() - launched))

    def mark(self, phase: str) -> None:
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; expected one of {', '.join(PHASES)}")
        self.marks.append((phase, time.perf_counter()))

    def mark_once(self, phase: str) -> None:
        """Mark `phase` unless it has begun already (a restarted worker starts again)."""
        if all(name != phase for name, _ in self.marks):
            self.mark(phase)

    def seconds(self, until: float | None = None) -> dict[str, float]:
        """Each phase's seconds so far (the last one up to `until`, by default now)."""
        end = time.perf_counter() if until is None else until
        ends = [at for _, at in self.marks[1:]] + [end]
        durations: dict[str, float] = {}
        for (phase, began), ended in zip(self.marks, ends, strict=True):
            durations[phase] = durations.get(phase, 0.0) + max(0.0, ended - began)
        return durations

    def summary(self) -> dict[str, Any]:
        """The summary's fields: `phases`, `startup_seconds` and `teardown_seconds`."""
        phases = self.seconds()
        return {
            "phases": {name: round(value, 4) for name, value in phases.items()},
            "startup_seconds": round(sum(phases.get(p, 0.0) for p in STARTUP), 4),
            "teardown_seconds": round(sum(phases.get(p, 0.0) for p in TEARDOWN), 4),
        }


def seconds_since_launch() -> float | None:
    """How long ago this process started, when it is the `ember` command (else None: under
    `ember.fit` in a longer-lived program, its start is not the run's)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    command = os.path.basename(sys.argv[0]) if sys.argv else ""
    if getattr(spec, "name", None) not in ("ember.__main__", "ember.cli") and command != "ember":
        return None
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            # field 22 is the start in clock ticks after boot; the name (field 2) may hold spaces
            started = int(stat.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
            return max(0.0, float(uptime.read().split()[0]) - started)
    except (OSError, ValueError, IndexError):
        return None


class PeakMemory:
    """The run's peak memory over its processes: the sum of each one's peak resident set
    (VmHWM), read from /proc while it lives; this process's own is read at the end."""

    def __init__(self) -> None:
        self.peaks: dict[int, int] = {}  # pid -> highest VmHWM seen, in bytes

    def sample(self, pids: Iterable[int | None]) -> None:
        for pid in pids:
            if pid is not None:
                peak = vm_hwm(pid)
                if peak is not None:
                    self.peaks[pid] = max(peak, self.peaks.get(pid, 0))

    def total(self) -> int:
        own = vm_hwm(os.getpid()) or 0
        return own + sum(v for pid, v in self.peaks.items() if pid != os.getpid())


def vm_hwm(pid: int) -> int | None:
    """A live process's peak resident set in bytes (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def pids_of(processes: Iterable[Any]) -> list[int | None]:
    """The pids of multiprocessing children still running (None for the others)."""
    return [p.pid if p is not None and p.exitcode is None else None for p in processes]


__all__ = ["PHASES", "PeakMemory", "Timeline", "pids_of", "seconds_since_launch", "vm_hwm"]
