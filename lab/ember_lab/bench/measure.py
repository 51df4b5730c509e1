"""CPU and memory of a benchmark row: this process and every process it starts, sampled."""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any

import psutil


class TreeSampler:
    """Samples the CPU use and resident memory of this process and all its descendants
    (ember's servers and workers, Spark's JVM and Python workers) on a background thread.

    CPU is reported as a percentage of all cores, so 100 means every core was busy."""

    def __init__(self, exclude: set[int] | None = None, interval: float = 0.25) -> None:
        self.interval = interval
        self.exclude = exclude or set()  # these processes and theirs are not measured
        self.cores = psutil.cpu_count() or 1
        self._root = psutil.Process()
        self._known: dict[int, psutil.Process] = {}  # cpu_percent needs the same object each time
        self._cpu: list[float] = []
        self._memory: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ember-bench-sampler", daemon=True)

    def __enter__(self) -> TreeSampler:
        self._sample()  # primes cpu_percent, whose first reading is always 0
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(10.0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            cpu, memory = self._sample()
            self._cpu.append(cpu)
            self._memory.append(memory)

    def _sample(self) -> tuple[float, float]:
        try:
            processes = [self._root, *self._root.children(recursive=True)]
            skipped = set(self.exclude)
            for pid in self.exclude:
                skipped.update(c.pid for c in psutil.Process(pid).children(recursive=True))
        except psutil.Error:
            return 0.0, 0.0
        processes = [p for p in processes if p.pid not in skipped]
        cpu = memory = 0.0
        alive = {}
        for process in processes:
            process = self._known.get(process.pid, process)
            try:
                cpu += process.cpu_percent(None)
                memory += process.memory_info().rss
            except psutil.Error:  # it ended between the listing and the reading
                continue
            alive[process.pid] = process
        self._known = alive
        # Each process's share is taken over its own interval since its last reading; those
        # intervals differ by milliseconds, so the sum can overshoot the machine's capacity.
        return min(cpu / self.cores, 100.0), memory / 2**20

    def figures(self) -> dict[str, Any]:
        """Mean and peak CPU (% of all cores) and peak memory (MB) over the samples taken."""
        if not self._cpu:
            return {"cpu_mean_percent": None, "cpu_peak_percent": None, "peak_memory_mb": None}
        return {
            "cpu_mean_percent": sum(self._cpu) / len(self._cpu),
            "cpu_peak_percent": max(self._cpu),
            "peak_memory_mb": max(self._memory),
        }
