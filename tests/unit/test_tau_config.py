"""`--tau N|auto|loss`: the CLI, a YAML file and RunConfig agree, and a bad value or a strategy
the adaptive periods do not apply to is one ConfigError naming what applies."""

from __future__ import annotations

import pytest

from ember.cli import build_parser, main
from ember.config import FIELD_NAMES, RunConfig, make_config
from ember.errors import ConfigError


def cli_config(*flags: str) -> RunConfig:
    args = build_parser().parse_args(["train", *flags])
    return make_config({name: getattr(args, name) for name in FIELD_NAMES}, args.config)


@pytest.mark.parametrize(
    ("flags", "tau", "policy"),
    [
        ([], 8, "fixed"),
        (["--tau", "16"], 16, "fixed"),
        (["--tau", "auto"], 8, "auto"),
        (["--tau", "loss"], 8, "loss"),
        (["--tau-policy", "auto", "--tau", "32"], 32, "auto"),  # auto from a starting tau
        (["--tau", "auto", "--tau-policy", "auto"], 8, "auto"),
    ],
)
def test_the_cli_takes_an_integer_or_a_policy(flags, tau, policy) -> None:
    config = cli_config("--strategy", "easgd-async", *flags)
    assert (config.tau, config.tau_policy) == (tau, policy)
    assert config.to_dict()["tau"] == tau and config.to_dict()["tau_policy"] == policy


def test_a_yaml_file_takes_tau_auto_and_a_flag_wins(tmp_path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("strategy: easgd-async\ntau: loss\n")
    assert cli_config("--config", str(path)).tau_policy == "loss"
    assert (cli_config("--config", str(path), "--tau", "4").tau_policy, 4) == ("fixed", 4)
    path.write_text("strategy: easgd-async\ntau_policy: auto\ntau: 64\n")
    config = cli_config("--config", str(path))
    assert (config.tau, config.tau_policy) == (64, "auto")


def test_run_config_and_the_api_fields_take_the_policy() -> None:
    config = RunConfig(strategy="easgd-async", tau_policy="auto").validate()
    assert (config.tau, config.tau_policy) == (8, "auto")
    assert make_config({"strategy": "easgd-async", "tau": "loss"}).tau_policy == "loss"
    assert RunConfig(**config.to_dict()) == config


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tau": "fast"}, "tau must be an integer >= 1, auto or loss; got 'fast'"),
        ({"tau": "8"}, "tau must be an integer >= 1, auto or loss; got '8'"),
        ({"tau": "auto", "tau_policy": "loss"}, "tau auto contradicts tau_policy 'loss'"),
        ({"tau_policy": "adaptive"}, "tau_policy must be one of fixed, auto, loss; got 'adapt"),
        ({"tau_policy": 3}, "tau_policy must be str, got 3"),
        (
            {"strategy": "single", "workers": 1, "tau": "auto"},
            "tau auto applies to strategy easgd-async only; strategy 'single' has no tau",
        ),
        (
            {"strategy": "allreduce", "tau": "loss"},
            "tau loss applies to strategy easgd-async only; strategy 'allreduce' has no tau",
        ),
        ({"strategy": "bsp", "tau_policy": "auto"}, "strategy 'bsp' has no tau"),
        ({"strategy": "async", "tau": "auto"}, "strategy 'async' has no tau"),
        ({"strategy": "ssp", "tau": "loss"}, "strategy 'ssp' has no tau"),
        (
            {"strategy": "easgd", "tau": "auto"},
            "tau auto applies to strategy easgd-async only: easgd's workers exchange in rounds"
            " they must all agree on, so its tau is a fixed integer; use --strategy easgd-async",
        ),
    ],
)
def test_a_bad_tau_is_one_config_error_naming_what_applies(fields, message) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as caught:
        make_config(fields)
    assert "\n" not in str(caught.value)


def test_the_cli_exits_2_naming_the_tau_before_starting_anything(capsys, tmp_path) -> None:
    out = tmp_path / "run"
    assert main(["train", "--strategy", "single", "--workers", "1", "--tau", "auto"]) == 2
    assert "ember: error: tau auto applies to strategy easgd-async only" in capsys.readouterr().err
    assert main(["train", "--tau", "sometimes", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "ember: error: tau must be an integer >= 1, auto or loss; got 'sometimes'" in err
    assert not out.exists()


def test_help_names_the_policies(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "also takes auto" in text and "or loss" in text and "--tau-policy" in text


def test_resuming_a_fixed_tau_run_with_tau_auto_names_the_flag_typed() -> None:
    from ember.config import resumed_values

    saved = RunConfig(strategy="easgd-async").to_dict()
    with pytest.raises(ConfigError, match=r"drop --tau or start a new --out"):
        resumed_values(saved, {"tau_policy": "auto"}, "runs/x/checkpoints/last")
