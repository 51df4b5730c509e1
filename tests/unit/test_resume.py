"""A resumed run keeps the configuration saved with its checkpoint, but for how it runs."""

from __future__ import annotations

import re

import pytest

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
