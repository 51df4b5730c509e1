"""The whole model comes back: a BatchNorm model trained by any strategy ends with trained
buffers, the summary's figures are those of the module `ember.fit` returns, and the run's
model.safetensors loads into plain PyTorch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch

import ember
from ember.checkpoint import load_checkpoint, save_checkpoint
from ember.data import load_dataset
from ember.worker.evaluation import evaluate
from ember.worker.spec import Layout, checkpoint_meta

pytestmark = pytest.mark.timeout(240)
BN = "tests.bn_models:bn_mlp"
STRATEGIES = ["single", "bsp", "ssp", "async", "easgd", "easgd-async", "allreduce", "diloco"]
REPO = Path(__file__).resolve().parents[2]


def _fit(out: Path, strategy: str, **fields: object) -> ember.RunResult:
    workers = 1 if strategy == "single" else 2
    settings = {"epochs": 3, "seed": 0, **fields}
    return ember.fit(
        model=BN, data="mnist", strategy=strategy, workers=workers, out=str(out), **settings
    )


def _assert_trained_buffers(model: torch.nn.Module) -> None:
    for layer in (model[2], model[6]):
        assert layer.running_mean.abs().sum() > 0, "running_mean still all zeros"
        assert not torch.allclose(layer.running_var, torch.ones_like(layer.running_var))
        assert layer.num_batches_tracked.item() > 0


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_batchnorm_model_ends_with_trained_buffers_under_every_strategy(
    tmp_path: Path, strategy: str
) -> None:
    result = _fit(tmp_path / "run", strategy)
    model = result.model
    assert not model.training
    _assert_trained_buffers(model)
    assert result.summary["test_accuracy"] >= 0.97
    assert result.summary["buffers"] == 2 * (128 + 128 + 1)
    # the summary's figures are an evaluation of exactly this module
    mnist = load_dataset("mnist")
    scores = evaluate(model, mnist.x_test, mnist.y_test)
    accuracy, loss = scores["test_accuracy"], scores["test_loss"]
    assert accuracy == result.summary["test_accuracy"]
    assert loss == pytest.approx(result.summary["test_loss"], rel=1e-6)


LOAD_WITHOUT_EMBER = """
    import sys
    import numpy as np
    import safetensors.torch
    import torch
    from tests.bn_models import bn_mlp

    model = bn_mlp(input_shape=(1, 28, 28), num_classes=10)
    model.load_state_dict(safetensors.torch.load_file(sys.argv[1]), strict=True)
    model.eval()
    x = torch.from_numpy(np.load(sys.argv[2]))
    with torch.no_grad():
        np.save(sys.argv[3], model(x).numpy())
    assert not any(name.split(".")[0] == "ember" for name in sys.modules), "ember was imported"
"""


def test_model_safetensors_loads_strictly_in_plain_pytorch_and_predicts_the_same(
    tmp_path: Path,
) -> None:
    result = _fit(tmp_path / "run", "easgd-async", epochs=1)
    export = result.run_dir / "model.safetensors"
    described = json.loads((result.run_dir / "model.json").read_text())
    assert described["model"] == BN and described["input_shape"] == [1, 28, 28]
    assert described["num_classes"] == 10
    assert "2.running_mean" in described["buffers"] and "1.weight" in described["parameters"]
    state = safetensors.torch.load_file(str(export))
    assert state["2.num_batches_tracked"].dtype == torch.int64
    assert state["1.weight"].shape == (128, 784)
    rows = load_dataset("mnist").x_test[:256]
    np.save(tmp_path / "x.npy", rows)
    script = tmp_path / "load.py"
    script.write_text(textwrap.dedent(LOAD_WITHOUT_EMBER))
    done = subprocess.run(
        [
            sys.executable,
            str(script),
            str(export),
            str(tmp_path / "x.npy"),
            str(tmp_path / "y.npy"),
        ],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    with torch.no_grad():
        here = result.model(torch.from_numpy(rows)).numpy()
    # Another process agrees to float32 round-off, not bit for bit: its BLAS may split and
    # order a row's 784 products otherwise (threads, buffer alignment); weights that differ
    # would be off by far more than this. In one process the same module is exact (below).
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), here, rtol=1e-5, atol=2e-5)
    # ember.load gives the same module from the run directory, naming the factory
    loaded = ember.load(result.run_dir, model=BN)
    with torch.no_grad():
        np.testing.assert_array_equal(loaded(torch.from_numpy(rows)).numpy(), here)


def test_a_resumed_run_starts_from_its_checkpoints_buffers(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = _fit(out, "bsp", epochs=1)
    # the run is complete: resuming it trains no further, so the model is the checkpoint's
    again = _fit(out, "bsp", epochs=1, resume="auto")
    for key, value in first.model.state_dict().items():
        torch.testing.assert_close(again.model.state_dict()[key], value, rtol=0, atol=0)
    _assert_trained_buffers(again.model)
    saved = load_checkpoint(out / "checkpoints")
    assert saved.meta["buffers"] == 2 * (128 + 128 + 1)


def test_a_checkpoint_from_before_buffers_loads_with_its_parameters_and_a_warning(
    tmp_path: Path,
) -> None:
    trained = _fit(tmp_path / "run", "single", epochs=1)
    old_meta = checkpoint_meta(trained.config, Layout(trained.summary["parameters"]), 7)
    del old_meta["buffers"]  # as a checkpoint written before buffers were carried
    parameters = trained.params[: trained.summary["parameters"]]
    old = save_checkpoint(tmp_path / "old", 7, {"params": parameters}, old_meta)
    with pytest.warns(UserWarning, match="predates buffers in checkpoints"):
        model = ember.load(old, model=BN)
    fresh = ember.load(trained.run_dir, model=BN)
    torch.testing.assert_close(model[1].weight, fresh[1].weight, rtol=0, atol=0)
    assert model[2].num_batches_tracked.item() == 0  # buffers as the factory builds them
    # and a run resumes from it, training its buffers from there
    with pytest.warns(UserWarning, match="predates buffers in checkpoints"):
        resumed = _fit(tmp_path / "resumed", "single", epochs=1, resume=str(old))
    assert resumed.summary["resumed_from"] == str(old)


@pytest.mark.parametrize("strategy", ["bsp", "async", "diloco"])
def test_compressed_pushes_carry_buffer_changes_that_add_up(tmp_path: Path, strategy: str) -> None:
    # int8 with error feedback: the buffers' changes are sent, so what rounding drops is sent
    # later, and compressed pulls leave each worker's statistics where the servers' are
    result = _fit(tmp_path / "run", strategy, compress="int8")
    _assert_trained_buffers(result.model)
    assert result.summary["test_accuracy"] >= 0.97
