"""An error speaks the caller's language: keywords to a caller of the Python API, flags to a
user of `ember train`, from the one message config writes."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import ember
from ember.config.flags import in_python_terms
from ember.errors import ConfigError


@pytest.mark.parametrize(
    ("said", "python"),
    [
        ("use --device cpu, or auto", 'use device="cpu", or auto'),
        ("use --tau auto or an integer", 'use tau="auto" or an integer'),
        ("use --strategy easgd-async for one", 'use strategy="easgd-async" for one'),
        ("(use --device cpu, or --fragments 1)", '(use device="cpu", or fragments=1)'),
        ("pass --resume PATH to see why", "pass resume=PATH to see why"),
        ("choose another --out", "choose another out="),
        ("it must divide --servers and --tau", "it must divide servers= and tau="),
        ("the run sets it (--lr, --weight-decay)", "the run sets it (lr=, weight_decay=)"),
    ],
)
def test_a_flag_becomes_the_keyword_that_sets_it(said: str, python: str) -> None:
    assert in_python_terms(said) == python


def test_ember_fit_names_keywords_and_ember_train_names_flags(tmp_path) -> None:
    with pytest.raises(ConfigError) as refused:
        ember.fit(data="digits", workers=500, out=str(tmp_path / "a"))
    assert str(refused.value).endswith("; lower workers= or batch_size=")
    done = subprocess.run(
        [sys.executable, "-m", "ember", "train", "--data", "digits", "--workers", "500"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode != 0
    assert done.stderr.strip().endswith("; lower --workers or --batch-size")


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(*(torch.nn.Linear(8, 8) for _ in range(10)))


def test_an_estimators_model_instance_is_refused_in_one_line_naming_its_class() -> None:
    """Not with the module's repr, twenty lines of its layers: by its class, with what to
    pass instead."""
    from ember.spark import model_spec

    with pytest.raises(ConfigError) as refused:
        model_spec(SmallCNN())
    said = str(refused.value)
    assert "\n" not in said and "Linear" not in said
    assert said.startswith("model is an instance of SmallCNN, which Spark ML cannot save")
    assert f"pass its class as '{__name__}:SmallCNN'" in said
