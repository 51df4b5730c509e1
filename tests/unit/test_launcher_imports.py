"""The launcher of a local run starts the workers' fork server before anything else, so its
imports of torch and ember run while the launcher loads data and starts the servers (the
launcher itself never imports torch: tests/integration/test_startup.py)."""

from __future__ import annotations

from pathlib import Path

from tests.processes import run_python

# Stands in for the fork server's start: records whether torch was loaded by then, and ends
# the run there (nothing is started).
PROBE = """
import sys
from ember.api import run_config
from ember.engines import LocalEngine, ParsedRun, forking

def started():
    print("torch loaded" if "torch" in sys.modules else "torch not loaded")
    raise SystemExit(0)

forking.start_forkserver = started
ParsedRun(run_config({"out": sys.argv[1]}), show_progress=False).execute(LocalEngine())
"""


def test_the_fork_server_starts_before_the_launcher_imports_torch(tmp_path: Path) -> None:
    done = run_python(PROBE, str(tmp_path / "run"), timeout=120)
    assert done.stdout.strip() == "torch not loaded"
