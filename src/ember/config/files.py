"""Where a run's fields come from: defaults, a YAML file and the flags or arguments a user
gave, with one error naming any field that is not one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ember.config.choices import did_you_mean
from ember.config.run import DILOCO_TAU, FIELD_NAMES, RunConfig
from ember.config.strategies import Strategy
from ember.config.tau import split_tau
from ember.errors import ConfigError


def make_config(overrides: dict[str, Any], config_file: str | None = None) -> RunConfig:
    """Defaults <- YAML file <- overrides (flags win); unknown keys are an error naming them."""
    return fresh_config(explicit_fields(overrides, config_file))


def fresh_config(explicit: dict[str, Any]) -> RunConfig:
    """The validated configuration of a run that starts afresh from the fields a user set."""
    # single trains one process: its worker count goes without saying (a different one given
    # explicitly is still the error validate() names)
    if explicit.get("strategy") == Strategy.SINGLE.value and "workers" not in explicit:
        explicit = {**explicit, "workers": 1}
    if explicit.get("strategy") == Strategy.DILOCO.value and "tau" not in explicit:
        explicit = {**explicit, "tau": DILOCO_TAU}
    return RunConfig(**explicit).validate()


def explicit_fields(overrides: dict[str, Any], config_file: str | None = None) -> dict[str, Any]:
    """The fields a user set: the YAML file's, then the overrides that are not None (flags
    win); unknown keys are an error naming them."""
    values: dict[str, Any] = {}
    if config_file is not None:
        values.update(_read_yaml(config_file))
    from_file = set(values)
    values.update({k: v for k, v in overrides.items() if v is not None})
    split_tau(values)
    unknown = sorted(set(values) - set(FIELD_NAMES))
    if unknown:
        where = f" in config file {config_file}" if from_file.issuperset(unknown) else ""
        near = did_you_mean(unknown, FIELD_NAMES)
        raise ConfigError(
            f"unknown configuration field(s) {', '.join(unknown)}{where}; "
            + (near or f"allowed: {', '.join(FIELD_NAMES)}")
        )
    return values


def _read_yaml(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read ({exc.strerror})") from exc
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: not valid YAML ({exc})") from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path}: expected a mapping of field: value")
    return {str(k).replace("-", "_"): v for k, v in loaded.items()}
