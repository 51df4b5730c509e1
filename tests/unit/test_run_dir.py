"""A run's directory: --out, or one of its own that no other run of the same second shares."""

from __future__ import annotations

from pathlib import Path

import pytest

from ember.config import RunConfig
from ember.engines.rundir import claim_run_dir


def test_runs_started_in_one_second_by_one_process_each_claim_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("time.strftime", lambda _: "20261206-120000")
    config = RunConfig(strategy="bsp")
    claimed = [claim_run_dir(config, config.run_dir()) for _ in range(3)]
    assert len(set(claimed)) == 3 and all(path.is_dir() for path in claimed)
    first = claimed[0].name
    assert [path.name for path in claimed] == [first, f"{first}-2", f"{first}-3"]


def test_out_is_the_directory_whether_or_not_it_exists(tmp_path: Path) -> None:
    config = RunConfig(out=str(tmp_path / "mine"))
    assert claim_run_dir(config, config.run_dir()) == tmp_path / "mine"
    (tmp_path / "mine").mkdir()
    assert claim_run_dir(config, config.run_dir()) == tmp_path / "mine"  # --resume goes on in it
