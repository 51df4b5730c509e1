"""A user's training through `ember.fit`: their model object, loss, optimizer and data of any
dtype and shape, under every strategy on the local engine, to a stated quality; and the
misfits that are one clear error before anything starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ember
from ember.errors import ConfigError
from tests.task_models import (
    LENGTH,
    TinyEncoder,
    bn_cnn,
    halve_every_100,
    per_token_accuracy,
    regression_data,
    regression_net,
    reversal_data,
    rmsprop,
)

pytestmark = pytest.mark.timeout(300)
STRATEGIES = ["single", "bsp", "ssp", "async", "easgd", "easgd-async", "allreduce", "diloco"]


def _fit(out: Path, strategy: str, **fields: Any) -> ember.RunResult:
    workers = 1 if strategy == "single" else 2
    # the elastic strategies exchange often enough for a few epochs; diloco's outer steps too
    tau = {"easgd": 4, "easgd-async": 4, "diloco": 16}.get(strategy)
    extra = {"tau": tau} if tau else {}
    return ember.fit(strategy=strategy, workers=workers, out=str(out), seed=0, **extra, **fields)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_regression_with_mse_and_adamw_under_every_strategy(
    tmp_path: Path, strategy: str
) -> None:
    x, y = regression_data(6000)
    result = _fit(
        tmp_path / "run",
        strategy,
        model=regression_net(),
        data=(x, y),
        loss="mse",
        optimizer="adamw",
        lr=3e-3,
        weight_decay=0.01,
        epochs=6,
    )
    summary = result.summary
    assert summary["loss"] == "mse" and "test_accuracy" not in summary
    assert summary["test_r2"] >= 0.8, summary  # a constant predictor has 0
    assert summary["test_rmse"] == pytest.approx(summary["test_loss"] ** 0.5, rel=1e-4)
    held_out = torch.from_numpy(x[-600:])
    with torch.no_grad():
        predicted = result.model(held_out).numpy()
    assert predicted.shape == (600, 2)
    rmse = float(np.sqrt(np.mean((predicted - y[-600:]) ** 2)))
    assert rmse == pytest.approx(summary["test_rmse"], rel=1e-4)  # the module returned


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_transformer_on_token_ids_with_per_token_cross_entropy_under_every_strategy(
    tmp_path: Path, strategy: str
) -> None:
    tokens, targets = reversal_data(6000)
    assert tokens.dtype == np.int64 and targets.shape == (6000, LENGTH)
    result = _fit(
        tmp_path / "run",
        strategy,
        model=TinyEncoder(),
        data=(tokens, targets),
        optimizer="adamw",
        lr=3e-3,
        epochs=12,
        metrics=["accuracy", per_token_accuracy],
    )
    summary = result.summary
    # a token guessed at random is right 1 time in 12; a whole sequence 1 in 12^8
    assert summary["test_accuracy"] >= 0.95, summary
    assert summary["test_per_token_accuracy"] >= 0.7, summary


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_batchnorm_cnn_built_by_a_callable_under_every_strategy(
    tmp_path: Path, strategy: str
) -> None:
    result = _fit(
        tmp_path / "run",
        strategy,
        model=bn_cnn,
        data="digits",
        optimizer="adam",
        lr=1e-3,
        epochs=2,
    )
    assert result.summary["test_accuracy"] >= 0.9, result.summary
    assert result.model[1].num_batches_tracked.item() > 0  # the statistics came back


def test_a_dict_of_inputs_reaches_the_model_as_keyword_arguments(tmp_path: Path) -> None:
    x, y = regression_data(3000)
    inputs = {"left": x[:, :4], "right": x[:, 4:]}
    result = ember.fit(
        model=TwoInputs(),
        data=(inputs, y),
        loss="l1",
        metrics="mae,r2",
        optimizer="adam",
        lr=3e-3,
        strategy="single",
        epochs=4,
        out=str(tmp_path / "run"),
    )
    assert result.summary["test_r2"] >= 0.7, result.summary
    assert result.summary["test_mae"] == pytest.approx(result.summary["test_loss"], rel=1e-4)


class TwoInputs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.left, self.right = torch.nn.Linear(4, 32), torch.nn.Linear(4, 32)
        self.head = torch.nn.Linear(32, 2)

    def forward(self, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.left(left) + self.right(right)))


def test_a_torch_dataset_is_taken_as_data(tmp_path: Path) -> None:
    x, y = regression_data(2000)
    dataset = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    result = ember.fit(
        model=regression_net(),
        data=dataset,
        loss="huber",
        optimizer="adamw",
        lr=3e-3,
        strategy="single",
        epochs=4,
        out=str(tmp_path / "run"),
    )
    assert result.summary["test_r2"] >= 0.6, result.summary


@pytest.mark.parametrize("strategy", ["single", "easgd-async"])
def test_an_optimizer_and_a_schedule_given_as_callables(tmp_path: Path, strategy: str) -> None:
    result = _fit(
        tmp_path / "run",
        strategy,
        model=regression_net(),
        data=regression_data(4000),
        loss="mse",
        optimizer=rmsprop,
        scheduler=halve_every_100,
        epochs=4,
    )
    assert result.summary["config"]["optimizer"].startswith("object:optimizer:")
    assert result.summary["test_r2"] >= 0.7, result.summary


def test_a_torch_optim_class_is_taken_by_its_name(tmp_path: Path) -> None:
    result = _fit(
        tmp_path / "run",
        "bsp",
        model=regression_net(),
        data=regression_data(4000),
        loss="mse",
        optimizer=torch.optim.AdamW,
        lr=3e-3,
        epochs=3,
    )
    assert result.summary["config"]["optimizer"] == "adamw"
    assert result.summary["test_r2"] >= 0.7, result.summary


def _wrong_width_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((output - target[:, :1]) ** 2).sum(dim=0)  # one value per column, not a scalar


MISFITS = {
    "targets wider than the output": (
        dict(loss="mse", data=(regression_data(100)[0], np.zeros((100, 3), np.float32))),
        "must output values of shape (batch, 3); got (2, 2)",
    ),
    "float targets for cross-entropy": (
        dict(data=regression_data(100)),
        "must be 1-D (one label per row), got shape (100, 2)",
    ),
    "a loss that is not one number": (
        dict(loss=_wrong_width_loss, data=regression_data(100)),
        "must return one number (a scalar tensor), got (2,)",
    ),
    "a server strategy with rmsprop": (
        dict(loss="mse", data=regression_data(100), strategy="bsp", optimizer="rmsprop"),
        "optimizer 'rmsprop' cannot run on the parameter servers of strategy 'bsp'",
    ),
    "an optimizer object on the servers": (
        dict(loss="mse", data=regression_data(100), strategy="ssp", optimizer=rmsprop),
        "an optimizer object runs on the workers, and strategy 'ssp' runs its optimizer on the"
        " parameter servers",
    ),
    "accuracy of values": (
        dict(loss="mse", data=regression_data(100), metrics="accuracy"),
        "metrics: 'accuracy' does not apply to loss 'mse', whose targets are values",
    ),
}


@pytest.mark.parametrize("fields, message", MISFITS.values(), ids=MISFITS.keys())
def test_a_misfit_is_one_clear_error_before_anything_starts(
    tmp_path: Path, fields: dict[str, Any], message: str
) -> None:
    settings = {"strategy": "single", "epochs": 1, **fields}
    with pytest.raises(ConfigError, match=_escaped(message)):
        ember.fit(model=regression_net(), out=str(tmp_path / "run"), **settings)
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing ran


def _escaped(message: str) -> str:
    import re

    return re.escape(message)


def test_regression_files_train_by_name_as_the_command_line_names_them(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    x, y = regression_data(3000)
    np.savez(tmp_path / "values.npz", x=x, y=y)
    rows = pa.table({"features": list(x), "label": list(y)})  # label: a list of two per row
    pq.write_table(rows, tmp_path / "values.parquet")
    for name in ("values.npz", "values.parquet"):
        result = ember.fit(
            data=str(tmp_path / name),
            model="tests.task_models:regression_net",
            loss="mse",
            optimizer="adam",
            lr=3e-3,
            strategy="single",
            epochs=4,
            out=str(tmp_path / f"run-{name}"),
        )
        assert result.summary["test_r2"] >= 0.7, (name, result.summary)
