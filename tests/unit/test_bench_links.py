"""`ember bench --hosts --link`: the rows it plans per link, its checks of link names, the config
file a cluster row's driver reads, and the report's section on links. No root needed."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ember.config import make_config
from ember.errors import ConfigError
from ember_lab.bench.groups import group_records
from ember_lab.bench.hosts import config_file, nominal_rate, transfer_bytes
from ember_lab.bench.linkreport import speedups
from ember_lab.bench.report import write_report
from ember_lab.bench.rows import (
    BenchSettings,
    make_tasks,
    plan_link_rows,
    plan_rows,
    tc_rate,
)
from tests.unit.test_bench_report import record, sweep

TASKS = make_tasks(False, 1000, 10)


def test_link_rows_are_mllib_torch_every_strategy_on_spark_then_the_sweep(
    tmp_path: Path,
) -> None:
    settings = BenchSettings(
        out=tmp_path, tasks=["mlp"], strategies=["single", "bsp", "allreduce"], taus=[4, 16],
        hosts=3,
    )  # fmt: skip
    rows = plan_link_rows(settings, TASKS, "100mbit")
    labels = [r.label for r in rows]
    # single has no Spark-engine row; ember's allreduce runs beside TorchDistributor's
    assert labels == [
        "mllib", "torchdistributor", "bsp", "allreduce", "easgd-async tau=auto",
        "easgd-async tau=loss", "easgd-async tau=4", "easgd-async tau=16",
    ]  # fmt: skip
    assert {r.link for r in rows} == {"100mbit"}
    ember = [r for r in rows if r.config is not None]
    assert {r.engine for r in ember} == {"spark"}
    assert {r.config.workers for r in ember} == {3}  # type: ignore[union-attr]
    assert [r.config.tau for r in rows if r.sweep] == [4, 16]  # type: ignore[union-attr]


def test_only_link_rows_still_run_single_here_for_the_speedup(tmp_path: Path) -> None:
    settings = BenchSettings(
        out=tmp_path, tasks=["mlp"], strategies=["single", "bsp"], hosts=2, local=False
    )
    rows = plan_rows(settings, TASKS)
    assert [(r.label, r.engine, r.link) for r in rows] == [("single", "local", None)]


def test_without_mllib_torch_or_a_sweep_task_those_rows_are_left_out(tmp_path: Path) -> None:
    settings = BenchSettings(
        out=tmp_path, tasks=["mlp"], strategies=["bsp"], mllib=False, torch=False,
        sweep_tasks=[], hosts=2,
    )  # fmt: skip
    assert [r.label for r in plan_link_rows(settings, TASKS, "1gbit")] == ["bsp"]


@pytest.mark.parametrize("link", ["100mbit", "1gbit", "2.5gbit", "500kbit", "unlimited"])
def test_rates_and_unlimited_are_link_names(link: str) -> None:
    assert tc_rate(link) == (None if link == "unlimited" else link)


@pytest.mark.parametrize("link", ["fast", "100", "100mb", "0mbit", "-1gbit", ""])
def test_a_bad_link_is_one_config_error_naming_it(link: str, tmp_path: Path) -> None:
    settings = BenchSettings(out=tmp_path / "b", links=["1gbit", link], hosts=2)
    with pytest.raises(ConfigError, match=f"--link {link!r}"):
        settings.validate(TASKS)


def test_compressed_link_rows_are_bsp_async_and_easgd_and_a_bad_codec_is_refused(
    tmp_path: Path,
) -> None:
    settings = BenchSettings(
        out=tmp_path, tasks=["mlp"], strategies=["bsp"], compress=["int8"], mllib=False,
        torch=False, sweep_tasks=[], hosts=2,
    )  # fmt: skip
    rows = plan_link_rows(settings, TASKS, "100mbit")
    assert [r.label for r in rows] == ["bsp", "bsp int8", "async int8"]
    assert [r.config.compress for r in rows] == ["none", "int8", "int8"]  # type: ignore[union-attr]
    swept = plan_link_rows(replace(settings, sweep_tasks=["mlp"], taus=[]), TASKS, "100mbit")
    assert [(r.label, r.config.compress, r.config.tau_policy) for r in swept[3:]] == [  # type: ignore[union-attr]
        ("easgd-async tau=auto", "none", "auto"),
        ("easgd-async tau=loss", "none", "loss"),
        ("easgd-async tau=auto int8", "int8", "auto"),
        ("easgd-async tau=loss int8", "int8", "loss"),
    ]
    bad = BenchSettings(out=tmp_path / "b", compress=["int3"], hosts=2)
    with pytest.raises(ConfigError, match="int3"):
        bad.validate(TASKS)


def test_a_link_is_measured_for_about_three_seconds_at_its_nominal_rate() -> None:
    assert nominal_rate("100mbit") == 12.5e6
    assert nominal_rate("1gbit") == 125e6
    assert nominal_rate("unlimited") is None
    assert transfer_bytes("100mbit") == int(3 * 12.5e6)
    assert transfer_bytes("100kbit") == 8 << 20  # at least 8 MiB
    assert transfer_bytes("unlimited") == 512 << 20


def test_a_cluster_rows_config_file_gives_back_its_config(tmp_path: Path) -> None:
    settings = BenchSettings(out=tmp_path, tasks=["mlp"], strategies=["easgd-async"], hosts=2)
    row = plan_link_rows(settings, TASKS, "1gbit")[-1]
    assert row.config is not None
    config = make_config(
        {"master": "spark://198.18.0.10:7077", "out": str(tmp_path / "run"), "eval_every": 5}
    )
    config = make_config({**row.config.to_dict(), **config.to_dict()} | {"extra": None})
    path = config_file(config, tmp_path / "config.json")
    written = json.loads(path.read_text())
    assert "batch_size" not in written  # a default is left to the run
    assert make_config({}, str(path)) == config


def link_record(row: str, link: str, rate: float, **fields: Any) -> dict[str, Any]:
    made = (
        sweep("mlp", fields.pop("tau"), 0, **fields)
        if "tau" in fields
        else record("mlp", row, 0, **fields)
    )
    return made | {"link": link, "hosts": 2, "engine": "spark", "link_bytes_per_second": rate}


def link_records() -> list[dict[str, Any]]:
    rows = []
    for link, rate in (("1gbit", 120e6), ("100mbit", 11.9e6)):
        rows += [
            link_record("single", link, rate, samples_per_second=100.0, time_to_target=20.0),
            link_record("allreduce", link, rate, samples_per_second=50.0),
            link_record("torchdistributor", link, rate, system="torch", strategy=None),
        ]
        rows += [
            link_record(
                "", link, rate, tau=tau, divergence=1.25, time_to_target=40.0 / tau, workers=2
            )
            for tau in (1, 4)
        ]
    return rows


def test_speedup_is_against_single_with_n_over_d() -> None:
    groups = group_records([r for r in link_records() if r["link"] == "100mbit"])["mlp"]
    points = speedups(groups, None)
    assert [p["tau"] for p in points] == [1.0, 4.0]
    one, four = points
    assert four["measured"] == pytest.approx(400.0 / 100.0)  # sweep rows run 100 * tau samples/s
    assert four["predicted"] == pytest.approx(440.0 / 100.0)
    assert four["time"] == pytest.approx(20.0 / 10.0)
    assert one["bound"] == four["bound"] == pytest.approx(2 / 1.25)


def test_the_report_has_a_table_and_plots_per_link_and_a_speedup_at_the_slowest(
    tmp_path: Path,
) -> None:
    settings = {"links": ["1gbit", "100mbit"], "links_run": {"hosts": 2}}
    written = write_report([record("mlp", "bsp", 0), *link_records()], tmp_path, settings)
    report = (tmp_path / "report.md").read_text()
    assert "### 1gbit (960 Mbit/s measured; 2 worker hosts of one core)" in report
    assert "### 100mbit (95 Mbit/s measured; 2 worker hosts of one core)" in report
    assert report.index("### 1gbit") < report.index("### 100mbit")
    section = report[report.index("### Speedup against tau at 100mbit") :]
    assert "| mlp | 4 | 4.00x | 4.40x | 2.00x | 1.60x |" in section
    names = {p.name for p in written}
    for link in ("1gbit", "100mbit"):
        assert {f"curve-mlp-{link}.png", f"throughput-{link}.png"} <= names
        assert f"](curve-mlp-{link}.png)" in report
    assert "speedup-100mbit.png" in names and "speedup-1gbit.png" not in names
    bsp_local = [line for line in report.splitlines() if line.startswith("| bsp | local |")]
    assert len(bsp_local) == 1  # the local table holds the local row alone


def test_a_report_without_link_rows_says_why(tmp_path: Path) -> None:
    reason = "the emulated cluster needs root (network namespaces, veths, a bridge)"
    write_report([record("mlp", "bsp", 0)], tmp_path, {"links_run": {"skipped": reason}})
    assert f"Link rows were not run: {reason}." in (tmp_path / "report.md").read_text()


def test_the_spark_engine_gets_rows_for_every_strategy_but_single(tmp_path: Path) -> None:
    settings = BenchSettings(
        out=tmp_path, tasks=["mlp"], strategies=["single", "bsp", "allreduce"],
        engines=["local", "spark"], mllib=False, sweep_tasks=[],
    )  # fmt: skip
    labels = [r.label for r in plan_rows(settings, TASKS)]
    assert labels == ["single", "bsp", "allreduce", "bsp (spark)", "allreduce (spark)"]
