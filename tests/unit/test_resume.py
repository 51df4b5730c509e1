"""A resumed run keeps the configuration saved with its checkpoint, but for how it runs."""

from __future__ import annotations

import re

import numpy as np
import pytest

import ember
from ember.api import run_config
from ember.checkpoint import save_checkpoint
from ember.config import RunConfig, make_config, resumed_values
from ember.errors import CheckpointError, ConfigError

WHERE = "runs/try1/checkpoints/step-00000940"


def saved_bsp_run() -> dict:
    return make_config({"strategy": "bsp", "data": "digits", "lr": 0.02, "epochs": 1}).to_dict()


def test_a_resumed_run_keeps_its_saved_fields_and_notes_a_changed_epochs() -> None:
    explicit = {"out": "runs/try1", "resume": "auto", "epochs": 20}
    values, changed = resumed_values(saved_bsp_run(), explicit, WHERE)
    config = RunConfig(**values).validate()
    assert (config.strategy, config.data, config.lr, config.epochs) == ("bsp", "digits", 0.02, 20)
    assert (config.out, config.resume) == ("runs/try1", "auto")
    assert changed == ["epochs 1 -> 20"]


def test_an_explicit_field_equal_to_the_saved_one_is_no_change() -> None:
    values, changed = resumed_values(saved_bsp_run(), {"strategy": "bsp", "lr": 0.02}, WHERE)
    assert (values["strategy"], values["lr"], changed) == ("bsp", 0.02, [])


def test_a_changed_strategy_is_refused_naming_the_checkpoint_and_both_values() -> None:
    message = (
        f"resume: strategy was 'bsp' in {WHERE}, got 'easgd-async'; drop --strategy or start"
        " a new --out"
    )
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        resumed_values(saved_bsp_run(), {"strategy": "easgd-async", "epochs": 20}, WHERE)


def test_every_changed_fixed_field_is_named_in_one_error() -> None:
    message = (
        f"resume: lr was 0.02 and batch_size was 64 in {WHERE}, got 0.05 and 32; drop --lr and"
        " --batch-size or start a new --out"
    )
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        resumed_values(saved_bsp_run(), {"lr": 0.05, "batch_size": 32}, WHERE)


def test_the_saved_run_directory_and_resume_are_not_inherited_and_unknown_fields_ignored() -> None:
    saved = {**saved_bsp_run(), "out": "runs/old", "resume": "auto", "future_field": 1}
    values, changed = resumed_values(saved, {"resume": WHERE}, WHERE)
    assert "out" not in values and "future_field" not in values
    assert (values["resume"], changed) == (WHERE, [])


def test_a_saved_config_that_is_not_a_mapping_is_a_checkpoint_error() -> None:
    message = (
        f"checkpoint {WHERE}: its manifest's config must be a mapping of field: value, got list"
    )
    with pytest.raises(CheckpointError, match=f"^{re.escape(message)}$"):
        resumed_values(["bsp"], {"epochs": 2}, WHERE)


def test_a_saved_config_with_a_bad_type_is_a_checkpoint_error_naming_the_field() -> None:
    message = (
        f"checkpoint {WHERE}: its manifest's config is invalid: lr must be a finite number,"
        " got 'fast'"
    )
    with pytest.raises(CheckpointError, match=f"^{re.escape(message)}$"):
        resumed_values({**saved_bsp_run(), "lr": "fast"}, {"epochs": 2}, WHERE)


def save_run(out, config: dict) -> str:
    meta = {"config": config, "step": 0}
    return str(save_checkpoint(out / "checkpoints", 7, {"params": np.zeros(3, np.float32)}, meta))


def test_run_config_with_resume_auto_takes_the_newest_checkpoints_config(tmp_path, capsys) -> None:
    where = save_run(tmp_path, saved_bsp_run())
    config = run_config({"out": str(tmp_path), "resume": "auto", "epochs": 2, "strategy": None})
    assert (config.strategy, config.data, config.lr, config.epochs) == ("bsp", "digits", 0.02, 2)
    assert capsys.readouterr().err == f"ember: resuming from {where}: epochs 1 -> 2\n"


def test_run_config_without_a_checkpoint_to_resume_starts_from_the_fields_given(tmp_path) -> None:
    config = run_config({"out": str(tmp_path / "new"), "resume": "auto", "lr": 0.1})
    assert (config.strategy, config.lr) == ("easgd-async", 0.1)


def test_resuming_as_single_names_the_strategy_alone_not_the_worker_count(tmp_path) -> None:
    where = save_run(tmp_path, saved_bsp_run())
    with pytest.raises(ConfigError) as error:
        run_config({"out": str(tmp_path), "resume": "auto", "strategy": "single"})
    assert str(error.value) == (
        f"resume: strategy was 'bsp' in {where}, got 'single'; drop --strategy or start a new --out"
    )


def test_run_config_reads_a_yaml_files_fields_as_explicit(tmp_path) -> None:
    where = save_run(tmp_path, saved_bsp_run())
    (tmp_path / "run.yaml").write_text("data: mnist\n")
    with pytest.raises(ConfigError, match=re.escape(f"data was 'digits' in {where}, got 'mnist'")):
        run_config({"out": str(tmp_path), "resume": "auto"}, str(tmp_path / "run.yaml"))


def test_a_checkpoint_without_a_saved_config_is_a_checkpoint_error(tmp_path) -> None:
    where = str(
        save_checkpoint(tmp_path / "checkpoints", 7, {"params": np.zeros(3, np.float32)}, {})
    )
    message = f"checkpoint {where}: its manifest's config must be a mapping of field: value"
    with pytest.raises(CheckpointError, match=re.escape(message)):
        run_config({"out": str(tmp_path), "resume": "auto"})


@pytest.mark.parametrize("fit", [ember.fit, ember.spark.fit], ids=["fit", "spark.fit"])
def test_fit_refuses_to_resume_a_run_with_another_strategy_before_training(tmp_path, fit) -> None:
    where = save_run(tmp_path, {**saved_bsp_run(), "engine": "spark"})
    # in the caller's words: keywords, where `ember train` is told the flags (above)
    message = f"resume: strategy was 'bsp' in {where}, got 'async'; drop strategy= or start a"
    with pytest.raises(ConfigError, match=re.escape(message) + r" new out=$"):
        fit(out=str(tmp_path), resume="auto", strategy="async", engine="spark")
