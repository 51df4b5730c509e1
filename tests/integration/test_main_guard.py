"""A script that calls ember.fit outside `if __name__ == "__main__":` stops before it starts
(ember.spark.fit needs no guard: tests/spark/test_spark_script.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)
GUARD = '`if __name__ == "__main__":`'


def run_script(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    out = tmp_path / "run"
    script.write_text(textwrap.dedent(source).replace("OUT", repr(str(out))))
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=150,
        cwd=tmp_path,
        env=os.environ,
    )


def unguarded(caller: str, line: int, spawned: str = "its workers") -> str:
    return (
        f"{caller} was called at the top level of train.py (line {line}); {spawned} are"
        f" spawned processes that import train.py again, so put the call under {GUARD}"
    )


def test_a_top_level_call_fails_with_one_message_before_anything_starts(tmp_path) -> None:
    done = run_script(
        tmp_path,
        """
        import ember

        ember.fit(data="digits", epochs=1, workers=2, out=OUT)
        """,
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == f"ember.errors.ConfigError: {unguarded('ember.fit', 4)}"
    assert not (tmp_path / "run").exists()


def test_a_call_in_a_function_run_from_unguarded_code_names_the_top_level_line(tmp_path) -> None:
    done = run_script(
        tmp_path,
        """
        import ember


        def main():
            return ember.fit(data="digits", epochs=1, workers=2, out=OUT)


        main()
        """,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].endswith(unguarded("ember.fit", 9))
    assert not (tmp_path / "run").exists()


def test_a_call_in_a_function_run_under_the_main_guard_trains(tmp_path) -> None:
    done = run_script(
        tmp_path,
        """
        import ember


        def main():
            return ember.fit(data="digits", epochs=1, workers=2, out=OUT)


        if __name__ == "__main__":
            print(main().summary["test_accuracy"])
        """,
    )
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.split()[-1]) > 0.8


def test_the_reversed_main_guard_is_accepted_too(tmp_path) -> None:
    # engine "local" is refused by spark.fit only after the guard is checked
    done = run_script(
        tmp_path,
        """
        import ember

        if '__main__' == __name__:
            ember.spark.fit(data="digits", engine="local", out=OUT)
        """,
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.endswith("ember.spark.fit runs on engine 'spark', got 'local'")


def test_a_spawned_child_importing_an_unguarded_call_exits_with_the_one_line(tmp_path) -> None:
    done = run_script(
        tmp_path,
        """
        import multiprocessing

        import ember

        if __name__ == "__mp_main__":  # what a spawned child runs of an unguarded script
            ember.fit(data="digits", epochs=1, workers=2, out=OUT)


        def nothing():
            pass


        if __name__ == "__main__":
            child = multiprocessing.get_context("spawn").Process(target=nothing)
            child.start()
            child.join()
            print(child.exitcode)
        """,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "1\n"
    assert done.stderr == unguarded("ember.fit", 7) + "\n"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("handed", "what"),
    [("model=Net()", "model"), ("model=Net", "model"), ("model='mlp', loss=my_loss", "loss")],
)
def test_a_class_or_function_under_the_main_guard_is_one_line_naming_it(
    tmp_path: Path, handed: str, what: str
) -> None:
    """The workers import the script without running its guarded block, so they could never
    find what it defines there: said before anything starts, with where to define it."""
    done = run_script(
        tmp_path,
        f"""
        import torch
        from torch import nn

        import ember

        if __name__ == "__main__":

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.linear = nn.Linear(64, 10)

                def forward(self, x):
                    return self.linear(x.flatten(1))

            def my_loss(output, target):
                return nn.functional.cross_entropy(output, target)

            ember.fit({handed}, data="digits", epochs=1, workers=2, out=OUT)
        """,
    )
    assert done.returncode == 1
    name, line = ("my_loss", 17) if what == "loss" else ("Net", 9)
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        f"ember.errors.ConfigError: {what}: {name} is defined under the main guard of train.py"
        f" (line {line}), which the local engine's workers do not run when they import"
        f" train.py: define {name} at the top level of the script, not under its main guard"
    )
    assert not (tmp_path / "run").exists()
