"""The launcher of a local run starts the workers' fork server before it imports torch, so the
fork server's imports of torch and ember run beside the launcher's own instead of after them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# Stands in for the fork server's start: records whether torch was loaded by then, and ends
# the run there (nothing is started).
PROBE = """
import sys
from ember.api import run_config
from ember.engines import forking, train

def started():
    print("torch loaded" if "torch" in sys.modules else "torch not loaded")
    raise SystemExit(0)

forking.start_forkserver = started
train(run_config({"out": sys.argv[1]}), show_progress=False)
"""


def test_the_fork_server_starts_before_the_launcher_imports_torch(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "run")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "torch not loaded"
