"""The emulated cluster's view of the Spark master: an answer that is not yet a whole JSON
document means the master is still starting, not that the harness should crash."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from ember_lab.emulated import standalone


def answering(stdout: str, returncode: int = 0) -> Any:
    def run(command: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, returncode, stdout=stdout, stderr="")

    return run


@pytest.mark.parametrize("stdout", ["", '{"workers": [', "<html>starting</html>"])
def test_a_master_still_starting_counts_as_not_answering(monkeypatch, stdout):
    monkeypatch.setattr(standalone.subprocess, "run", answering(stdout))
    assert standalone.master_state() is None
    assert standalone.alive_workers() == 0


def test_alive_workers_counts_only_alive_ones(monkeypatch):
    page = '{"workers": [{"state": "ALIVE"}, {"state": "DEAD"}, {"state": "ALIVE"}]}'
    monkeypatch.setattr(standalone.subprocess, "run", answering(page))
    assert standalone.alive_workers() == 2


def test_a_failed_fetch_counts_as_not_answering(monkeypatch):
    monkeypatch.setattr(standalone.subprocess, "run", answering("", returncode=1))
    assert standalone.master_state() is None
