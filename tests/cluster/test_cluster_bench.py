"""`ember bench --hosts 2 --link unlimited` on the session's cluster, at the smallest settings
(TorchDistributor and one ember strategy): the rows run with their drivers in host 0 and come
back as records and a report section."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ember_lab.bench.rows import BenchSettings
from ember_lab.bench.runner import run_bench
from ember_lab.emulated import netns

pytestmark = pytest.mark.timeout(900)


def test_bench_rows_run_across_hosts_and_the_report_has_their_link(
    cluster: netns.Cluster, spark_env: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "bench"
    settings = BenchSettings(
        out=out, quick=True, tasks=["mlp"], strategies=["easgd-async"], sweep_tasks=[],
        hosts=2, links=["unlimited"], local=False, mllib=False,  # MLlib: minutes on 2 cores
    )  # fmt: skip
    lines: list[str] = []
    records = run_bench(settings, log=lines.append, cluster=cluster)
    by_row = {r["row"]: r for r in records}
    assert set(by_row) == {"torchdistributor", "easgd-async"}, lines
    failed = {r["row"]: r["error"] for r in records if r["status"] != "ok"}
    assert not failed, failed
    for record in records:
        assert record["link"] == "unlimited" and record["hosts"] == 2
        assert record["link_bytes_per_second"] > 0
        # one worker's exchanges over the link alone, timed (bench/exchange_probe.py)
        probe = record["link_exchange"]
        assert probe["exchanges"] == 40 and probe["bytes"] == 2 << 20
        assert 0 < probe["seconds"] < 10 and probe["client_cpu"] > 0
        assert probe["kernel_cpu"] >= 0  # the machine's CPU beyond both processes'
        assert record["curve"] and record["samples_per_second"] > 0
    ember = by_row["easgd-async"]
    assert ember["config"]["engine"] == "spark"
    assert ember["config"]["master"] == cluster.master_url and ember["config"]["workers"] == 2
    assert ember["bytes_per_sample"] > 0 and ember["predicted_samples_per_second"] > 0
    torch = by_row["torchdistributor"]
    assert torch["config"]["system"] == "TorchDistributor" and torch["config"]["workers"] == 2
    assert torch["bytes_per_sample"] > 0
    saved = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["row"] for r in saved] == [r["row"] for r in records]

    from ember_lab.bench.report import write_report

    written = write_report(records, out, settings.to_dict())
    report = (out / "report.md").read_text()
    # the heading names the rate and the latency the link measured
    heading = r"### unlimited \([\d,]+ Mbit/s, [\d.]+ ms one way measured; 2 worker hosts"
    assert re.search(heading, report), report
    assert any(p.name == "curve-mlp-unlimited.png" for p in written)
