"""`ember bench`'s diloco rows: whole-model at --diloco-tau and in --fragments beside
easgd-async's fixed and adaptive rows, on this host and on links. No root needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from ember.config import DILOCO_TAU
from ember.errors import ConfigError
from ember_lab.bench.rows import BenchSettings, make_tasks, plan_link_rows, plan_rows

TASKS = make_tasks(False, 1000, 10)


def test_link_rows_have_diloco_whole_and_in_fragments_beside_easgd_async(tmp_path: Path) -> None:
    settings = BenchSettings(
        out=tmp_path, tasks=["mlp", "cnn"], strategies=["single", "diloco", "allreduce"],
        sweep_tasks=["mlp", "cnn"], taus=[64], tau_policies=["auto"], diloco_tau=234,
        fragments=[2], hosts=2, mllib=False, torch=False,
    )  # fmt: skip
    rows = plan_link_rows(settings, TASKS, "100mbit")
    labels = [(r.task.name, r.label) for r in rows]
    expected = ["diloco", "allreduce", "diloco fragments=2", "easgd-async tau=auto",
                "easgd-async tau=64"]  # fmt: skip
    assert labels == [(task, label) for task in ("mlp", "cnn") for label in expected]
    configs = {r.label: r.config for r in rows if r.task.name == "cnn"}
    whole, streamed = configs["diloco"], configs["diloco fragments=2"]
    assert whole is not None and streamed is not None
    assert (whole.tau, whole.fragments, whole.servers) == (234, 1, 1)
    # fragment f is the keys of server f: as many servers as fragments
    assert (streamed.tau, streamed.fragments, streamed.servers) == (234, 2, 2)
    assert streamed.workers == 2 and streamed.engine == "spark"
    assert rows[0].task.model == "mlp" and rows[-1].task.model == "cnn_bn"


def test_diloco_rows_here_take_diloco_s_default_tau_not_easgd_s(tmp_path: Path) -> None:
    settings = BenchSettings(
        out=tmp_path, tasks=["mlp"], strategies=["easgd-async", "diloco"], taus=[],
        fragments=[1, 4], mllib=False,
    )  # fmt: skip
    rows = {r.label: r.config for r in plan_rows(settings, TASKS)}
    assert set(rows) == {"easgd-async", "diloco", "diloco fragments=4"}  # 1: the whole model
    assert rows["easgd-async"].tau == 8  # type: ignore[union-attr]
    assert rows["diloco"].tau == DILOCO_TAU  # type: ignore[union-attr]
    assert rows["diloco fragments=4"].servers == 4  # type: ignore[union-attr]


def test_outer_steps_add_whole_model_diloco_rows_beside_the_default_one(tmp_path: Path) -> None:
    settings = BenchSettings(
        out=tmp_path, tasks=["cnn"], strategies=["diloco"], sweep_tasks=[], diloco_tau=116,
        fragments=[2], outer=[(1.0, 0.0), (0.7, 0.6)], hosts=2, mllib=False, torch=False,
    )  # fmt: skip
    rows = {r.label: r.config for r in plan_link_rows(settings, TASKS, "100mbit")}
    assert list(rows) == ["diloco", "diloco outer=1/0", "diloco outer=0.7/0.6",
                          "diloco fragments=2"]  # fmt: skip
    steps = {label: (c.outer_lr, c.outer_momentum, c.tau, c.fragments)  # type: ignore[union-attr]
             for label, c in rows.items()}  # fmt: skip
    assert steps["diloco"] == (0.7, 0.9, 116, 1)  # the paper's outer step stays the default
    assert steps["diloco outer=1/0"] == (1.0, 0.0, 116, 1)
    assert steps["diloco outer=0.7/0.6"] == (0.7, 0.6, 116, 1)
    assert steps["diloco fragments=2"] == (0.7, 0.9, 116, 2)


def test_the_outer_flag_takes_lr_momentum_pairs_and_names_a_bad_one() -> None:
    from ember_lab.bench.commands import _outer_steps

    assert _outer_steps("1/0, 0.7/0.6") == [(1.0, 0.0), (0.7, 0.6)]
    assert _outer_steps("") == []
    for bad in ("1", "1/x", "/0.9"):
        with pytest.raises(ConfigError) as raised:
            _outer_steps(f"0.7/0.9,{bad}")
        assert str(raised.value) == f"--outer {bad!r}: expected LR/MOMENTUM, e.g. 1/0 or 0.7/0.9"


def test_diloco_tau_may_be_given_per_task_and_the_others_keep_the_default(
    tmp_path: Path,
) -> None:
    settings = BenchSettings(
        out=tmp_path, tasks=["mlp", "cnn", "lenet"], strategies=["diloco"], sweep_tasks=[],
        diloco_tau={"mlp": 234, "cnn": 116}, fragments=[2], hosts=2, mllib=False, torch=False,
    )  # fmt: skip
    settings.validate(TASKS)
    periods = {(r.task.name, r.label): (r.config.tau, r.config.fragments)  # type: ignore[union-attr]
               for r in plan_link_rows(settings, TASKS, "100mbit")}  # fmt: skip
    assert periods == {
        ("mlp", "diloco"): (234, 1), ("mlp", "diloco fragments=2"): (234, 2),
        ("cnn", "diloco"): (116, 1), ("cnn", "diloco fragments=2"): (116, 2),
        ("lenet", "diloco"): (DILOCO_TAU, 1), ("lenet", "diloco fragments=2"): (DILOCO_TAU, 2),
    }  # fmt: skip


def test_the_diloco_tau_flag_takes_a_count_or_task_count_pairs() -> None:
    from ember.cli import build_parser

    parse = build_parser().parse_args
    assert parse(["bench", "--diloco-tau", "116"]).diloco_tau == 116
    pairs = parse(["bench", "--diloco-tau", "mlp=234,cnn=116"]).diloco_tau
    assert pairs == {"mlp": 234, "cnn": 116}
    assert parse(["bench"]).diloco_tau == DILOCO_TAU


def test_fragment_rows_come_only_with_the_diloco_strategy(tmp_path: Path) -> None:
    settings = BenchSettings(
        out=tmp_path, tasks=["mlp"], strategies=["allreduce"], fragments=[2], sweep_tasks=[],
        hosts=2, mllib=False, torch=False,
    )  # fmt: skip
    assert [r.label for r in plan_link_rows(settings, TASKS, "1gbit")] == ["allreduce"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"fragments": [3]}, "fragments must divide tau; got fragments 3 with tau 200"),
        ({"tau_policies": ["often"]}, "unknown tau policy often; choose from auto, loss"),
        ({"outer": [(0.7, 1.0)]}, "outer_momentum must be in [0, 1), got 1.0"),
        (  # every task's period is checked, not only the first's
            {"tasks": ["mlp", "cnn"], "diloco_tau": {"mlp": 234, "cnn": 117}, "fragments": [2]},
            "fragments must divide tau; got fragments 2 with tau 117",
        ),
        ({"diloco_tau": {"mpl": 234}}, "unknown task mpl; choose from " + ", ".join(TASKS)),
    ],
)
def test_bad_diloco_and_policy_settings_are_refused_before_any_row_runs(
    tmp_path: Path, fields: dict, message: str
) -> None:
    settings = BenchSettings(out=tmp_path, **fields)
    with pytest.raises(ConfigError) as raised:
        settings.validate(TASKS)
    assert str(raised.value) == message


def test_epochs_may_be_given_per_task_and_the_others_keep_their_own() -> None:
    tasks = make_tasks(False, 1000, 10, {"cnn": 1, "mlp": 2})
    assert (tasks["cnn"].epochs, tasks["mlp"].epochs, tasks["lenet"].epochs) == (1, 2, 3)
    assert make_tasks(False, 1000, 10, 4)["cnn"].epochs == 4


def test_bench_epochs_flag_takes_a_count_or_task_count_pairs() -> None:
    from ember_lab.bench.commands import _count_per_task

    assert _count_per_task("3") == 3
    assert _count_per_task("mlp=3, cnn=1") == {"mlp": 3, "cnn": 1}
