"""Strategy answers what each named strategy implies, and stays its plain name everywhere else."""

from __future__ import annotations

import json

import pytest
import yaml

import ember
from ember.algorithms import ALGORITHMS, WorkerContext, make_algorithm, make_update_rule
from ember.config import STRATEGIES, AlgorithmKind, ConsistencyKind, RunConfig, Strategy
from ember.engines.join import JOINABLE
from ember.errors import ConfigError
from ember_lab.perfmodel import Calibration, Network, predict

# The table in README.md and DESIGN.md: strategy -> (algorithm, consistency, uses a server,
# every round waits for all workers, `ember join` can add a worker).
README_TABLE = {
    "single": ("single", "none", False, False, False),
    "bsp": ("sgd", "bsp", True, True, False),
    "ssp": ("sgd", "ssp", True, False, True),
    "async": ("sgd", "async", True, False, True),
    "easgd": ("easgd", "bsp", True, True, False),
    "easgd-async": ("easgd", "async", True, False, True),
    "allreduce": ("allreduce", "none", False, True, False),
    "diloco": ("diloco", "bsp", True, True, False),
}


@pytest.mark.parametrize("name", list(README_TABLE))
def test_each_strategy_sits_where_the_readme_table_puts_it(name: str) -> None:
    mode = Strategy(name)
    algorithm, consistency, uses_server, synchronous, joinable = README_TABLE[name]
    assert mode.algorithm is AlgorithmKind(algorithm)
    assert mode.consistency is ConsistencyKind(consistency)
    assert (mode.uses_server, mode.synchronous, mode.joinable) == (
        uses_server,
        synchronous,
        joinable,
    )


@pytest.mark.parametrize("name", list(README_TABLE))
def test_run_config_answers_through_its_strategy(name: str) -> None:
    config = RunConfig(strategy=name, workers=1).validate()
    assert config.mode is Strategy(name)
    assert (config.algorithm, config.consistency, config.uses_server) == README_TABLE[name][:3]


def test_only_easgd_async_overlaps_its_exchange_with_compute() -> None:
    assert [s.value for s in Strategy if s.overlaps_exchange] == ["easgd-async"]


def test_easgd_and_diloco_workers_step_alone_and_exchange_every_tau_steps() -> None:
    assert [s.value for s in Strategy if s.periodic] == ["easgd", "easgd-async", "diloco"]


def test_gradients_travel_under_sgd_and_allreduce_and_the_rest_step_locally() -> None:
    assert [s.value for s in Strategy if s.ships_gradients] == ["bsp", "ssp", "async", "allreduce"]
    assert [s.value for s in Strategy if not s.local_optimizer] == ["bsp", "ssp", "async"]


def test_strategies_lists_the_plain_names_in_the_readme_order() -> None:
    assert STRATEGIES == tuple(README_TABLE) == ember.STRATEGIES
    assert all(type(name) is str for name in STRATEGIES)


def test_a_strategy_equals_hashes_and_prints_as_its_name() -> None:
    mode = Strategy.EASGD_ASYNC
    assert mode == "easgd-async" and {"easgd-async": 1}[mode] == 1
    assert (str(mode), f"{mode}", ", ".join([mode, Strategy.BSP])) == (
        "easgd-async",
        "easgd-async",
        "easgd-async, bsp",
    )
    assert json.dumps({mode: mode}) == '{"easgd-async": "easgd-async"}'


def test_a_strategy_member_given_to_a_run_config_is_kept_as_its_plain_name() -> None:
    config = RunConfig(strategy=Strategy.BSP).validate()
    assert type(config.strategy) is str
    assert yaml.safe_load(yaml.safe_dump(config.to_dict()))["strategy"] == "bsp"
    with pytest.raises(ConfigError) as raised:
        RunConfig(strategy=Strategy.ALLREDUCE, servers=2).validate()
    assert str(raised.value) == (
        "servers must be 1 for strategy 'allreduce', which uses no parameter server; got 2"
    )


@pytest.mark.parametrize(
    ("given", "near"),
    [("easgd-asyn", "easgd-async"), ("dilocco", "diloco"), ("all-reduce", "allreduce")],
)
def test_a_misspelt_strategy_is_offered_the_nearest_name(given: str, near: str) -> None:
    names = "single, bsp, ssp, async, easgd, easgd-async, allreduce, diloco"
    expected = f"strategy must be one of {names}; got {given!r}: did you mean {near}?"
    with pytest.raises(ConfigError) as refused:
        RunConfig(strategy=given).validate()
    assert str(refused.value) == expected
    with pytest.raises(ConfigError) as refused:  # past RunConfig, where parts parse it
        make_algorithm(WorkerContext(config=RunConfig(strategy=given), rank=0, world=1))
    assert str(refused.value) == expected


def test_unknown_strategy_names_get_the_list_of_valid_ones() -> None:
    names = "single, bsp, ssp, async, easgd, easgd-async, allreduce, diloco"
    with pytest.raises(ConfigError, match=f"^strategy must be one of {names}; got 'gossip'$"):
        RunConfig(strategy="gossip").validate()
    # a worker's parts hold the strategy as a Strategy: the name fails as they are parsed
    with pytest.raises(ConfigError, match=f"^strategy must be one of {names}; got 'gossip'$"):
        make_algorithm(WorkerContext(config=RunConfig(strategy="gossip"), rank=0, world=1))
    calibration = Calibration(16, 0.001, 100, 0.001, 0.001, 0.001, 2)
    with pytest.raises(ValueError, match=f"^unknown strategy 'gossip'; choose from {names}$"):
        predict("gossip", 2, calibration, Network())


def test_every_strategy_has_a_worker_algorithm_and_only_server_ones_an_update_rule() -> None:
    assert list(ALGORITHMS) == list(Strategy)
    for mode in Strategy:
        config = RunConfig(strategy=mode.value, workers=1)
        if mode.uses_server:
            make_update_rule(config)
        else:
            with pytest.raises(ConfigError, match=f"^strategy '{mode.value}' uses no parameter"):
                make_update_rule(config)


def test_join_names_the_joinable_strategies_as_it_always_has() -> None:
    assert JOINABLE == ("async", "easgd-async", "ssp")
