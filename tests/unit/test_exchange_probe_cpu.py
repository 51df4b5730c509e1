"""The exchange probe's kernel CPU: the machine's busy time between two snapshots that no
process was charged for, where a process that exits in between takes only its last moments."""

from __future__ import annotations

import subprocess
import sys

from ember_lab.bench.exchange_probe import cpu_snapshot, unattributed_cpu

BURN = "import sys, time\nend = time.process_time() + 1.0\nwhile time.process_time() < end: pass\n"


def test_each_process_counts_what_it_used_between_the_snapshots() -> None:
    before = (10.0, {(1, 0.0): 5.0, (2, 0.0): 4.0})
    # 1 used 0.5 s more, 2 exited, a new 2 (pid reused) used 0.25 s: 0.25 s were the kernel's
    after = (11.0, {(1, 0.0): 5.5, (2, 9.0): 0.25})
    assert unattributed_cpu(before, after) == 0.25
    assert unattributed_cpu(after, after) == 0.0


def test_a_process_that_exits_between_the_snapshots_is_not_the_kernels_work() -> None:
    # a second of CPU, then it waits for its stdin to close and exits
    child = subprocess.Popen(
        [sys.executable, "-c", BURN + "print('burnt', flush=True)\nsys.stdin.read()\n"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline().strip() == "burnt"
    before = cpu_snapshot()
    child.stdin.close()
    child.wait(30)
    after = cpu_snapshot()
    child.stdout.close()
    assert unattributed_cpu(before, after) < 0.5  # the old sum counted the child's whole second
