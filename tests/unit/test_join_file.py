"""`ember join` reads a file the user may have damaged: each damage is one ConfigError naming
the file, before anything starts, and a file that cannot be read whole never hangs the join."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from ember.config import RunConfig
from ember.engines.join import JOIN_FILE, join_run, read_join_file, write_join_file
from ember.errors import ConfigError

pytestmark = pytest.mark.timeout(30)

SECRET = bytes(range(32))
SERVERS = ["tcp://127.0.0.1:40001"]


def _valid(strategy: str = "async") -> dict[str, object]:
    config = RunConfig(strategy=strategy, workers=2).validate()
    return {"servers": SERVERS, "secret": SECRET.hex(), "config": config.to_dict()}


def _written(**fields: object) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        path.write_text(json.dumps({**_valid(), **fields}))

    return damage


def _text(text: str) -> Callable[[Path], None]:
    return lambda path: path.write_text(text)


def _symlink_to_dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _huge(path: Path) -> None:
    with path.open("wb") as out:
        out.truncate(1 << 40)  # sparse: a terabyte that reads as zeros


DAMAGES = [
    (_written(servers=[]), "'servers' must be a non-empty list of tcp://HOST:PORT addresses"),
    (_written(servers="tcp://127.0.0.1:1"), "'servers' must be a non-empty list"),
    (_written(servers=[123]), "'servers' must be a non-empty list"),
    (_written(servers=["127.0.0.1"]), "'servers' must be a non-empty list"),
    (_written(secret=5), "'secret' must be 64 hexadecimal digits"),
    (_written(secret="zz"), "'secret' must be 64 hexadecimal digits"),
    (_written(config=[1]), "'config' must be an object"),
    (_text("[" * 100_000 + "]" * 100_000), "invalid JSON (nested too deeply)"),
    (_text("[1, 2]"), "not an object"),
    (_text("{not json"), "invalid JSON"),
    (_symlink_to_dev_zero, "not a regular file"),
    (_fifo, "not a regular file"),
    (_huge, "larger than"),
]


@pytest.mark.parametrize(("damage", "message"), DAMAGES)
def test_a_damaged_join_file_is_one_config_error_naming_it(
    tmp_path: Path, damage: Callable[[Path], None], message: str
) -> None:
    damage(tmp_path / JOIN_FILE)
    with pytest.raises(ConfigError) as info:
        join_run(tmp_path, epochs=1)
    assert str(info.value).startswith(f"{tmp_path / JOIN_FILE} is not the join file a run writes")
    assert message in str(info.value)


def test_a_join_file_claiming_a_strategy_that_takes_no_joiner_is_refused(tmp_path: Path) -> None:
    write_join_file(tmp_path, RunConfig(strategy="bsp", workers=2).validate(), SERVERS, SECRET)
    with pytest.raises(ConfigError) as info:
        join_run(tmp_path, epochs=1)
    assert str(info.value) == (
        f"{tmp_path / JOIN_FILE} claims strategy bsp, which cannot take a joiner;"
        " a worker joins only a run of async, easgd-async, ssp, or a worker range's run"
        " (--workers MIN:MAX) of a strategy with servers"
    )


def test_a_worker_range_run_of_a_synchronous_strategy_takes_a_joiner(tmp_path: Path) -> None:
    ranged = RunConfig(strategy="bsp", workers="2:4").validate()
    write_join_file(tmp_path, ranged, SERVERS, SECRET)
    config, servers, secret = read_join_file(tmp_path / JOIN_FILE, None)
    assert (config.workers, config.workers_max, config.joinable) == (2, 4, True)
    assert (servers, secret) == (SERVERS, SECRET)
