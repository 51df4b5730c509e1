"""TreeSampler: the CPU and memory of this process and the processes it starts."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from ember_lab.bench.measure import TreeSampler

BURN = "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass\n"


def test_a_busy_child_shows_in_cpu_and_memory_and_an_excluded_one_does_not() -> None:
    with TreeSampler(interval=0.1) as sampler:
        subprocess.run([sys.executable, "-c", BURN], check=True, timeout=30)
    busy = sampler.figures()
    one_core = 100 / (psutil.cpu_count() or 1)
    # the child spun as much of one core as a loaded machine gave it; a sampler that missed
    # it would see this process sleeping, near 0
    assert busy["cpu_peak_percent"] > 0.15 * one_core
    assert busy["cpu_peak_percent"] <= 100
    assert busy["peak_memory_mb"] > 10

    child = subprocess.Popen([sys.executable, "-c", BURN])
    try:
        with TreeSampler(exclude={child.pid}, interval=0.1) as sampler:
            time.sleep(1.0)
    finally:
        child.wait(30)
    assert sampler.figures()["cpu_mean_percent"] < 0.1 * one_core


def test_no_samples_gives_no_figures() -> None:
    sampler = TreeSampler(interval=60)
    assert sampler.figures() == {
        "cpu_mean_percent": None,
        "cpu_peak_percent": None,
        "peak_memory_mb": None,
    }
