"""`ember train --model pkg.module:factory` finds a package in the folder it is run from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ember

pytestmark = pytest.mark.timeout(180)
# the console script, whose sys.path[0] is its bin folder rather than the working directory
EMBER = Path(sys.executable).with_name("ember")
SRC = str(Path(ember.__file__).resolve().parents[1])
FACTORY = """
    from torch import nn


    def make_net(input_shape, num_classes):
        width = 784  # digits: 1 x 28 x 28
        return nn.Sequential(
            nn.Flatten(), nn.Linear(width, 32), nn.ReLU(), nn.Linear(32, num_classes)
        )
"""


def _ember_in(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [str(EMBER), *args],
        cwd=folder,
        env={**env, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        timeout=150,
    )


def test_a_model_factory_in_the_working_directory_trains_on_every_worker(tmp_path) -> None:
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "models.py").write_text(textwrap.dedent(FACTORY))
    out = tmp_path / "run"
    done = _ember_in(
        tmp_path,
        "train",
        "--model",
        "mypkg.models:make_net",
        "--data",
        "digits",
        "--epochs",
        "1",
        "--workers",
        "2",
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == "mypkg.models:make_net"
    assert summary["parameters"] == 784 * 32 + 32 + 32 * 10 + 10
    assert summary["test_accuracy"] > 0.5


def test_a_model_package_that_is_nowhere_is_an_error_naming_where_it_looked(tmp_path) -> None:
    done = _ember_in(tmp_path, "train", "--model", "mypkg.models:make_net", "--data", "digits")
    assert done.returncode == 2
    # before it, the start-up phases that ran: the data loaded
    assert done.stderr.strip().splitlines()[-1] == (
        "ember: error: model factory 'mypkg.models:make_net' cannot be imported: No module"
        f" named 'mypkg'; looked in the working directory {tmp_path}, then PYTHONPATH ({SRC})"
        " and the installed packages; check that mypkg/ or mypkg.py is in one of them, on"
        " every worker's machine"
    )
    assert not (tmp_path / "runs").exists()
