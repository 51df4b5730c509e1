"""`ember.fit` takes the user's model as an object: an nn.Module (copied, with its own initial
parameters) or a function building one, on every worker, never over ember's wire."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import ember
from ember.data import load_dataset
from ember.errors import ConfigError

pytestmark = pytest.mark.timeout(120)


class SmallBatchNormNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Flatten(), nn.Linear(784, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


@pytest.mark.parametrize("strategy", ["easgd-async", "bsp"])
def test_a_module_instance_trains_from_its_own_parameters_and_keeps_its_buffers(
    tmp_path: Path, strategy: str
) -> None:
    net = SmallBatchNormNet()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    result = ember.fit(model=net, data="digits", strategy=strategy, epochs=2, out=str(tmp_path))
    assert result.summary["model"] == "object:SmallBatchNormNet"
    assert result.summary["test_accuracy"] >= 0.85
    trained = result.model
    assert isinstance(trained, SmallBatchNormNet) and trained is not net
    assert trained.body[2].num_batches_tracked.item() > 0
    for key, value in net.state_dict().items():  # the caller's module is left as it was
        torch.testing.assert_close(value, before[key], rtol=0, atol=0)
    # the run directory names an object, which ember.load cannot build on its own
    with pytest.raises(ConfigError, match="trained with a model object \\(SmallBatchNormNet\\)"):
        ember.load(result.run_dir)
    again = ember.load(result.run_dir, model=SmallBatchNormNet())
    torch.testing.assert_close(again.body[1].weight, trained.body[1].weight, rtol=0, atol=0)


def build_linear(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[-1] * input_shape[-2], num_classes))


def test_a_function_building_the_model_is_called_with_the_datas_shape(tmp_path: Path) -> None:
    result = ember.fit(
        model=build_linear, data="digits", strategy="single", epochs=1, out=str(tmp_path)
    )
    assert result.summary["model"] == "object:build_linear"
    assert result.summary["test_accuracy"] >= 0.8
    assert result.model[1].weight.shape == (10, 784)


def test_a_model_the_workers_cannot_be_handed_is_one_error_before_anything_starts(
    tmp_path: Path,
) -> None:
    def local_build(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        return nn.Linear(784, num_classes)

    with pytest.raises(ConfigError, match="cannot be handed to the local engine's workers"):
        ember.fit(model=local_build, data="digits", out=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_a_model_that_is_neither_a_module_nor_callable_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        ember.fit(model=42, data="digits", out=str(tmp_path / "run"))
    assert str(refused.value) == (
        "model must be a name, package.module:function, an nn.Module or a callable returning"
        " one; got int"
    )
    assert not (tmp_path / "run").exists()


class Net(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(784, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def test_two_runs_of_objects_with_one_label_each_keep_their_own_model(tmp_path: Path) -> None:
    """The objects travel with their run, not in a table of the process: a second run whose
    model has the same label (object:Net) leaves the first run's model as it was trained."""
    fields = {"data": "digits", "strategy": "single", "epochs": 1}
    first = ember.fit(model=Net(32), out=str(tmp_path / "a"), **fields)
    second = ember.fit(model=Net(8), out=str(tmp_path / "b"), **fields)
    assert first.summary["model"] == second.summary["model"] == "object:Net"
    assert first.model.head.weight.shape == (10, 32)
    assert second.model.head.weight.shape == (10, 8)


class OwnCrossEntropy(nn.Module):
    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output, target)


def _evaluate(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ember", "evaluate", *flags],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parent,  # where this module imports from, by its name here
    )


def test_a_run_of_objects_is_scored_again_by_naming_where_they_are_defined(
    tmp_path: Path,
) -> None:
    """ember evaluate says what to pass, in its own flags: the data file for a run on arrays,
    and module:Name for the model and loss objects; model.json's load line names the class."""
    data = load_dataset("digits")
    np.savez(tmp_path / "digits.npz", x=data.x_test, y=data.y_test)
    result = ember.fit(
        model=SmallBatchNormNet(),
        loss=OwnCrossEntropy(),
        data=(data.x_train, data.y_train),
        strategy="single",
        epochs=1,
        out=str(tmp_path / "run"),
    )
    here = __name__
    described = json.loads((result.run_dir / "model.json").read_text())
    assert described["source"] == f"{here}:SmallBatchNormNet"
    assert described["load"].startswith(f"model = {here}.SmallBatchNormNet(...)")
    checkpoints = str(result.run_dir / "checkpoints")
    steps = [
        ((), "was trained on in-memory arrays; pass --data FILE"),
        (
            ("--data", str(tmp_path / "digits.npz")),
            f"was trained with a model object ({here}:SmallBatchNormNet); pass --model"
            f" {here}:SmallBatchNormNet to import and run it",
        ),
        (
            ("--data", str(tmp_path / "digits.npz"), "--model", f"{here}:SmallBatchNormNet"),
            f"was trained with a loss object ({here}:OwnCrossEntropy); pass --loss"
            f" {here}:OwnCrossEntropy",
        ),
    ]
    for flags, said in steps:
        refused = _evaluate("--checkpoint", checkpoints, *flags)
        assert refused.returncode != 0 and said in refused.stderr, refused.stderr
    scored = _evaluate(
        "--checkpoint", checkpoints, "--data", str(tmp_path / "digits.npz"),
        "--model", f"{here}:SmallBatchNormNet", "--loss", f"{here}:OwnCrossEntropy",
    )  # fmt: skip
    assert scored.returncode == 0, scored.stderr
    scores = json.loads(scored.stdout)
    assert scores["rows"] == len(data.y_test) and scores["test_accuracy"] >= 0.8
