"""When ember logs to MLflow: asked to, or with an MLflow run active; never by importing it."""

from __future__ import annotations

import sys

import pytest

from ember.errors import ConfigError
from ember.metrics.tracking import tracked, wanted


def test_without_the_flag_or_an_imported_mlflow_nothing_is_tracked_or_imported(
    monkeypatch,
) -> None:
    monkeypatch.delitem(sys.modules, "mlflow", raising=False)
    assert not wanted(None) and not wanted(False)
    assert tracked(None, object(), lambda: "trained") == "trained"
    assert "mlflow" not in sys.modules  # importing it costs seconds


def test_mlflow_true_without_the_package_is_one_clear_error(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow raises ImportError
    with pytest.raises(ConfigError) as refused:
        wanted(True)
    assert str(refused.value) == (
        "mlflow=True needs the mlflow package: pip install 'ember[mlflow]'"
    )
