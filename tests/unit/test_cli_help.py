"""`ember train --help` explains every flag, and a misspelled flag is an error that helps."""

from __future__ import annotations

import argparse
import re

import pytest

from ember.cli import build_parser, main
from ember.config import FIELD_NAMES

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path, monkeypatch) -> None:
    """A flag that is wrongly accepted starts a run: its directory lands here."""
    monkeypatch.chdir(tmp_path)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def _train_flags() -> dict[str, str]:
    train = _subparsers(build_parser())["train"]
    return {a.option_strings[-1]: a.help or "" for a in train._actions if a.option_strings}


def test_every_train_flag_has_help_that_says_more_than_its_default() -> None:
    flags = _train_flags()
    for name in FIELD_NAMES:
        text = flags["--" + name.replace("_", "-")]
        explanation = re.sub(r"\(default: [^)]*\)$", "", text).strip()
        assert len(explanation.split()) >= 3, f"--{name}: {text!r}"
        assert "None" not in text, f"--{name} should say what leaving it unset means: {text!r}"


def test_flags_whose_default_is_unset_say_what_unset_means() -> None:
    flags = _train_flags()
    assert "unset: 0.9 / workers" in flags["--alpha"]
    assert "unset: local[WORKERS]" in flags["--master"]
    assert "unset: runs/<timestamp>-<strategy>-<pid>" in flags["--out"]


def test_model_help_says_factories_are_imported_from_the_working_directory() -> None:
    assert "imported from the working directory" in _train_flags()["--model"]


def test_no_parser_accepts_an_abbreviated_flag() -> None:
    parser = build_parser()
    assert not parser.allow_abbrev
    for name, sub in _subparsers(parser).items():
        assert not sub.allow_abbrev, name


def test_a_misspelled_train_flag_is_an_error_suggesting_the_real_one(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--epoch", "3"])
    assert exit_info.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last == "ember train: error: unrecognized arguments: --epoch 3; did you mean --epochs?"


def test_two_misspelled_flags_each_get_a_suggestion(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--epoch=3", "--tua", "2"])
    assert capsys.readouterr().err.splitlines()[-1] == (
        "ember train: error: unrecognized arguments: --epoch=3 --tua 2;"
        " did you mean --epochs for --epoch, --tau for --tua?"
    )


def test_an_unknown_flag_near_no_real_one_points_to_help(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--frobnicate", "3"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "ember train: error: unrecognized arguments: --frobnicate 3;"
        " 'ember train --help' lists every flag"
    )


def test_a_misspelled_flag_of_another_subcommand_gets_a_suggestion_too(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "--bandwith", "1Gbit"])
    assert capsys.readouterr().err.splitlines()[-1] == (
        "ember plan: error: unrecognized arguments: --bandwith 1Gbit; did you mean --bandwidth?"
    )


def test_the_lab_commands_come_from_the_labs_entry_points() -> None:
    bench = _subparsers(build_parser())["bench"]
    assert "--quick" in {flag for a in bench._actions for flag in a.option_strings}


def test_without_the_lab_bench_and_plan_say_how_to_install_it(monkeypatch, capsys) -> None:
    monkeypatch.setattr("ember.cli.entry_points", lambda group: [])
    for command in (["bench", "--quick", "--out", "x"], ["plan"]):
        assert main(command) == 2
        error = capsys.readouterr().err.strip()
        assert error == (
            f"ember: error: `ember {command[0]}` is a command of ember's lab (the ember-lab"
            " package), which is not installed here: from ember's repository, pip install -e ./lab"
        )
