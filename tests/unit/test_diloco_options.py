"""diloco's options beside its outer step: --mixing-alpha (where a worker goes on from after
a round) and --fragment-sync-delay (the steps from a fragment's push to its merge), each
refused with one message naming it, and the mixing's arithmetic against torch.lerp."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember.algorithms.streaming import lerp
from ember.cli import build_parser, main
from ember.config import RunParts, make_config
from ember.errors import ConfigError


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"strategy": "diloco", "mixing_alpha": 1.5}, "mixing_alpha must be in [0, 1], got 1.5"),
        ({"strategy": "diloco", "mixing_alpha": -0.1}, "mixing_alpha must be in [0, 1], got -0.1"),
        ({"strategy": "diloco", "mixing_alpha": "0.5"}, "mixing_alpha must be a finite number"),
        (
            {"strategy": "easgd", "mixing_alpha": 0.5},
            "mixing_alpha applies to strategy diloco only; got 0.5 with strategy 'easgd'",
        ),
    ],
)
def test_a_mixing_alpha_outside_0_to_1_or_without_diloco_is_refused(fields, message) -> None:
    with pytest.raises(ConfigError) as raised:
        make_config(fields)
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize("alpha", [0, 0.5, 1])
def test_a_mixing_alpha_in_0_to_1_reaches_the_workers_strategy_part(alpha: float) -> None:
    fields = {"strategy": "diloco", "mixing_alpha": alpha, "fragments": 2, "servers": 2}
    config = make_config(fields)
    assert RunParts.of(config).strategy.mixing_alpha == alpha


def test_unset_mixing_alpha_keeps_embers_own_rule() -> None:
    config = make_config({"strategy": "diloco"})
    assert config.mixing_alpha is None and RunParts.of(config).strategy.mixing_alpha is None


def test_the_flag_sets_the_field_and_the_cli_refuses_a_bad_one_before_starting(
    capsys, tmp_path
) -> None:
    train = build_parser().parse_args(["train", "--mixing-alpha", "0.5"])
    assert train.mixing_alpha == 0.5
    out = tmp_path / "run"
    code = main(["train", "--strategy", "diloco", "--mixing-alpha", "2", "--out", str(out)])
    assert code == 2
    assert "ember: error: mixing_alpha must be in [0, 1], got 2.0" in capsys.readouterr().err
    assert not out.exists()


FRAGMENTED = {"strategy": "diloco", "fragments": 2, "servers": 2, "tau": 6}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"strategy": "diloco", "fragment_sync_delay": 1},
            "fragment_sync_delay applies to diloco with --fragments 2 or more; got 1 with"
            " fragments 1",
        ),
        (
            {"strategy": "easgd", "fragment_sync_delay": 0},
            "fragment_sync_delay applies to diloco with --fragments 2 or more; got 0 with"
            " fragments 1",
        ),
        (
            {**FRAGMENTED, "fragment_sync_delay": 4},
            "fragment_sync_delay must be between 0 and tau / fragments (3), got 4",
        ),
        (
            {**FRAGMENTED, "fragment_sync_delay": -1},
            "fragment_sync_delay must be between 0 and tau / fragments (3), got -1",
        ),
        ({**FRAGMENTED, "fragment_sync_delay": 1.5}, "fragment_sync_delay must be int, got 1.5"),
    ],
)
def test_a_sync_delay_past_the_stagger_or_without_fragments_is_refused(fields, message) -> None:
    with pytest.raises(ConfigError) as raised:
        make_config(fields)
    assert str(raised.value) == message


@pytest.mark.parametrize("delay", [0, 1, 3])
def test_a_sync_delay_up_to_the_stagger_reaches_the_workers_strategy_part(delay: int) -> None:
    config = make_config({**FRAGMENTED, "fragment_sync_delay": delay})
    assert RunParts.of(config).strategy.fragment_sync_delay == delay


def test_unset_sync_delay_is_embers_whole_stagger_and_the_flag_sets_it() -> None:
    assert make_config(FRAGMENTED).fragment_sync_delay is None
    train = build_parser().parse_args(["train", "--fragment-sync-delay", "1"])
    assert train.fragment_sync_delay == 1


@pytest.mark.parametrize("weight", [0.0, 0.25, 0.5, 1.0])
def test_the_mixing_is_torch_lerp_of_the_global_towards_the_local_parameters(weight) -> None:
    rng = np.random.default_rng(3)
    global_, local = (rng.standard_normal(11).astype(np.float32) for _ in range(2))
    expected = torch.lerp(torch.from_numpy(global_), torch.from_numpy(local), weight).numpy()
    mixed = local.copy()  # in place over the local parameters, as a merge does
    lerp(global_, mixed, weight, out=mixed)
    np.testing.assert_allclose(mixed, expected, rtol=1e-6, atol=1e-6)
    apart = np.empty_like(local)
    lerp(global_, local, weight, out=apart)
    np.testing.assert_array_equal(apart, mixed)
