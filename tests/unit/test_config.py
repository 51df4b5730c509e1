"""RunConfig and the CLI reject bad input with one clear message naming the field."""

from __future__ import annotations

import pytest

from ember.api import run_config
from ember.cli import main
from ember.config import RunConfig, Strategy, make_config
from ember.errors import ConfigError


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tau": 0}, "tau must be an integer >= 1, got 0"),
        ({"alpha": 0.0}, r"alpha must be in \(0, 1\], got 0.0"),
        ({"alpha": 1.5}, r"alpha must be in \(0, 1\], got 1.5"),
        ({"staleness": -1}, "staleness must be an integer >= 0, got -1"),
        ({"eval_every": -1}, "eval_every must be an integer >= 0, got -1"),
        ({"workers": 0}, "workers must be an integer >= 1, got 0"),
        (
            {"strategy": "gossip"},
            "strategy must be one of single, bsp, ssp, async, easgd, "
            "easgd-async, allreduce, diloco; got 'gossip'",
        ),
        ({"outer_lr": 0}, "outer_lr must be > 0, got 0"),
        ({"outer_momentum": 1.0}, r"outer_momentum must be in \[0, 1\), got 1.0"),
        ({"outer_momentum": -0.1}, r"outer_momentum must be in \[0, 1\), got -0.1"),
        ({"outer_lr": "0.7"}, "outer_lr must be a finite number, got '0.7'"),
        ({"engine": "ray"}, "engine must be one of local, spark; got 'ray'"),
        ({"lr": -0.1}, "lr must be > 0, got -0.1"),
        ({"strategy": "single", "workers": 2}, "workers must be 1 for strategy 'single', got 2"),
        ({"strategy": "allreduce", "servers": 2}, "servers must be 1 for strategy 'allreduce'"),
        ({"momentum": "0.9"}, "momentum must be a finite number, got '0.9'"),
        ({"nesterov": "false"}, "nesterov must be bool, got 'false'"),
        ({"request_timeout": float("inf")}, "request_timeout must be a finite number, got inf"),
        ({"worker_timeout": 90.0}, "request_timeout must be greater than worker_timeout .90."),
        (
            {"batch_sise": 3},
            r"^unknown configuration field.s. batch_sise; did you mean batch_size\?$",
        ),
        ({"zzz": 3}, "unknown configuration field.s. zzz; allowed: data, model"),
        ({"replicas": 3}, "replicas must be 1 or 2, got 3"),
        ({"strategy": "allreduce", "replicas": 2}, "replicas must be 1 for strategy 'allreduce'"),
        ({"max_restarts": -1}, "max_restarts must be an integer >= 0, got -1"),
        ({"replica_seconds": 0}, "replica_seconds must be > 0, got 0"),
    ],
)
def test_invalid_field_is_rejected_with_a_message_naming_it(fields, message) -> None:
    with pytest.raises(ConfigError, match=message):
        make_config(fields)


def test_defaults_are_the_main_job() -> None:
    config = make_config({})
    assert (config.data, config.model, config.strategy, config.workers) == (
        "mnist",
        "mlp",
        "easgd-async",
        2,
    )
    assert config.algorithm == "easgd" and config.consistency == "async"
    assert config.effective_alpha == pytest.approx(0.45)


def test_yaml_file_fills_fields_and_flags_win(tmp_path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("strategy: bsp\nworkers: 3\nbatch-size: 32\n")
    config = make_config({"workers": 4}, str(path))
    assert (config.strategy, config.workers, config.batch_size) == ("bsp", 4, 32)


def test_a_misspelt_yaml_key_gets_the_did_you_mean_a_flag_gets(tmp_path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("strategy: bsp\nepoch: 3\nbatch-sise: 32\n")
    with pytest.raises(ConfigError) as error:
        make_config({}, str(path))
    assert str(error.value) == (
        f"unknown configuration field(s) batch_sise, epoch in config file {path};"
        " did you mean batch_size for batch_sise, epochs for epoch?"
    )
    path.write_text("epoch: 3\n")
    with pytest.raises(ConfigError) as error:
        make_config({}, str(path))
    assert str(error.value) == (
        f"unknown configuration field(s) epoch in config file {path}; did you mean epochs?"
    )


def test_single_takes_one_worker_unless_told_otherwise(tmp_path) -> None:
    assert make_config({"strategy": "single"}).workers == 1
    path = tmp_path / "run.yaml"
    path.write_text("strategy: single\n")
    assert make_config({}, str(path)).workers == 1
    assert make_config({"strategy": "single", "workers": 1}).workers == 1
    assert make_config({"strategy": Strategy.SINGLE}).workers == 1
    # --resume auto where there is nothing to resume yet starts afresh, alike
    fresh = run_config({"strategy": "single", "resume": "auto", "out": str(tmp_path / "run")})
    assert fresh.workers == 1
    with pytest.raises(ConfigError) as error:
        make_config({"strategy": "single", "workers": 3})
    assert str(error.value) == "workers must be 1 for strategy 'single', got 3"


def test_yaml_file_that_is_not_a_mapping_is_rejected(tmp_path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        make_config({}, str(path))


def test_cli_exits_2_naming_the_field_before_starting_anything(capsys, tmp_path) -> None:
    code = main(["train", "--tau", "0", "--out", str(tmp_path / "run")])
    assert code == 2
    assert "ember: error: tau must be an integer >= 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_cli_rejects_unknown_flags_with_exit_code_2(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--tua", "3"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --tua" in capsys.readouterr().err


def test_cli_names_an_unreadable_data_path(capsys, tmp_path) -> None:
    code = main(["train", "--data", str(tmp_path / "missing.npz"), "--out", str(tmp_path / "r")])
    assert code == 2
    assert "missing.npz" in capsys.readouterr().err


def test_cli_names_a_model_factory_that_cannot_be_imported(capsys, tmp_path) -> None:
    code = main(["train", "--model", "nowhere.models:make", "--out", str(tmp_path / "r")])
    assert code == 2
    assert "model factory 'nowhere.models:make' cannot be imported" in capsys.readouterr().err


def test_run_config_round_trips_through_a_dict() -> None:
    config = RunConfig(strategy="ssp", staleness=3).validate()
    assert RunConfig(**config.to_dict()) == config


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"bind_address": "tcp://0.0.0.0"},
            "bind_address must be a host name or an IPv4 address, without a scheme or a port"
            r" \(ports go in --ports\); got 'tcp://0.0.0.0'",
        ),
        (
            {"advertise_address": "10.0.0.5:7100"},
            "advertise_address must be a host name or an IPv4 address, without a scheme or a"
            r" port \(ports go in --ports\); got '10.0.0.5:7100'",
        ),
        ({"advertise_address": ""}, "advertise_address must be a host name or an IPv4 address"),
        ({"ports": "7100"}, "ports must be LO-HI with 1 <= LO <= HI <= 65535, e.g. 7100-7199;"),
        ({"ports": "7199-7100"}, "ports must be LO-HI with 1 <= LO <= HI <= 65535"),
        ({"ports": "0-10"}, "ports must be LO-HI with 1 <= LO <= HI <= 65535"),
        ({"ports": "65535-65536"}, "ports must be LO-HI with 1 <= LO <= HI <= 65535"),
        ({"ports": 7100}, "ports must be str, got 7100"),
        (
            {"servers": 2, "replicas": 2, "ports": "7100-7102"},
            r"ports 7100-7102 holds 3 port\(s\), but the run listens on 4: 4 parameter-server"
            r" process\(es\) \(servers x replicas\); widen the range",
        ),
        (
            {"engine": "spark", "servers": 2, "ports": "7100-7101"},
            r"ports 7100-7101 holds 2 port\(s\), but the run listens on 3: 2 parameter-server"
            r" process\(es\) \(servers x replicas\) and the Spark record collector; widen",
        ),
    ],
)
def test_addresses_and_port_ranges_are_checked_naming_the_field(fields, message) -> None:
    with pytest.raises(ConfigError, match=f"^{message}"):
        make_config(fields)


def test_addresses_and_a_port_range_that_fits_are_accepted() -> None:
    config = make_config(
        {
            "engine": "spark",
            "servers": 2,
            "replicas": 2,
            "bind_address": "0.0.0.0",
            "advertise_address": "driver-1.cluster.example",
            "ports": "7100-7104",
        }
    )
    assert config.ports == "7100-7104" and config.advertise_address == "driver-1.cluster.example"
    assert make_config({"strategy": "allreduce", "ports": "7100-7100"}).ports == "7100-7100"


def test_cli_takes_the_address_flags_and_refuses_a_small_range_before_starting(
    capsys, tmp_path
) -> None:
    flags = ["--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1"]
    code = main(["train", *flags, "--servers", "2", "--ports", "7100-7100", "--out", str(tmp_path)])
    assert code == 2
    assert "ember: error: ports 7100-7100 holds 1 port(s)" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"workers": 4, "max_workers": 3}, r"max_workers must be between workers \(4\) and"),
        ({"max_workers": (1 << 20) + 1}, r"and 1048576, got 1048577"),
        ({"max_workers": "64"}, "max_workers must be int, got '64'"),
    ],
)
def test_max_workers_is_checked_against_workers_and_the_table_ceiling(fields, message) -> None:
    with pytest.raises(ConfigError, match=message):
        make_config(fields)


def test_max_workers_comes_from_a_flag_or_yaml_and_defaults_to_the_servers_formula(
    capsys, tmp_path
) -> None:
    assert make_config({}).max_workers is None  # the server's 4 x workers + 1024
    path = tmp_path / "run.yaml"
    path.write_text("workers: 3\nmax-workers: 8\n")
    assert make_config({}, str(path)).max_workers == 8
    code = main(["train", "--workers", "3", "--max-workers", "2", "--out", str(tmp_path / "r")])
    assert code == 2
    err = capsys.readouterr().err
    assert "ember: error: max_workers must be between workers (3) and 1048576, got 2" in err
