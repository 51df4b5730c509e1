"""The configuration's parts: every field in exactly one, and the servers handed theirs alone."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from ember.algorithms import make_update_rule
from ember.config import (
    FIELD_NAMES,
    PARTS,
    RunConfig,
    RunParts,
    ServerSettings,
    Strategy,
    part_of,
)


def test_every_field_belongs_to_exactly_one_part() -> None:
    counted = Counter(name for names in PARTS.values() for name in names)
    assert sorted(counted) == sorted(FIELD_NAMES)
    assert [name for name, times in counted.items() if times > 1] == []
    assert part_of("loss") == "training" and part_of("replicas") == "servers"


def test_the_servers_settings_hold_no_model_loss_data_or_addresses() -> None:
    config = RunConfig(
        strategy="bsp", workers=3, optimizer="adamw", optimizer_args={"betas": [0.8, 0.9]}
    ).validate()
    settings = ServerSettings.of(config)
    names = {f.name for f in dataclasses.fields(settings)}
    assert not names & {"model", "loss", "metrics", "data", "out", "master", "bind_address"}
    again = ServerSettings.from_dict(settings.to_dict())
    assert again == settings and again.consistency is config.consistency
    # the servers build the same rule from their part as the launcher from the whole
    assert make_update_rule(again, 10) == make_update_rule(config, 10)
    assert make_update_rule(again).betas == (0.8, 0.9)  # type: ignore[attr-defined]
    easgd = RunConfig(strategy="easgd-async", workers=4).validate()
    assert ServerSettings.of(easgd).effective_alpha == easgd.effective_alpha == 0.9 / 4


def test_the_parts_are_typed_copies_of_the_config_each_layer_reads() -> None:
    config = RunConfig(
        strategy="ssp", workers=3, servers=2, replicas=2, lr=0.2, max_restarts=5, data="digits"
    ).validate()
    parts = RunParts.of(config)
    types = {f.name: f.type for f in dataclasses.fields(RunConfig)}
    for part, names in PARTS.items():
        held = getattr(parts, part)
        for name in names:
            assert held is not None and getattr(held, name) == getattr(config, name), name
        # each part declares its fields as RunConfig does, but the strategy, typed once here
        declared = {n: "Strategy" if n == "strategy" else types[n] for n in names}
        assert {f.name: f.type for f in dataclasses.fields(held)} == declared
    assert type(parts.strategy.strategy) is Strategy is type(ServerSettings.of(parts).strategy)
    assert parts.strategy.uses_server and parts.strategy.effective_alpha == config.effective_alpha
    assert ServerSettings.of(parts) == ServerSettings.of(config)
    with pytest.raises(dataclasses.FrozenInstanceError):
        parts.engine.max_restarts = 0  # type: ignore[misc]
