"""A parameter server is a fresh interpreter: what it imports is its start-up time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def _imported_after(statement: str) -> set[str]:
    """The modules a fresh interpreter holds after `statement`, importing this tree."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    probe = f"{statement}\nimport sys\nprint('\\n'.join(sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_the_server_process_never_imports_torch() -> None:
    modules = _imported_after("import ember.engines.server_main")
    assert "ember.ps.server" in modules  # the probe did import the server
    assert "torch" not in modules


def test_the_package_still_offers_its_public_names() -> None:
    modules = _imported_after(
        "import ember\nfrom ember import fit, RunResult, spark\nassert spark.fit and fit"
    )
    assert {"ember.api", "ember.engines.rundir"} <= modules
    assert "torch" not in modules  # RunResult builds its model, with torch, when asked
