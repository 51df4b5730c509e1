"""A local session's JVM: quiet from its start; its class-data archive written after the first
session and read by later ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.processes import wait_for

pytestmark = pytest.mark.timeout(600)

STATIC_ARCHIVE_MAGIC = 0xF00BABA2
# A child with a session of ember's own, as `ember train --engine spark` starts it: it runs a
# job and reports its JVM's process id, Java options and whether it shares class data.
SESSION_OF_ITS_OWN = """
import json
from ember.config import RunConfig
from ember.engines.spark.session import session

with session(RunConfig(engine="spark", workers=2), show_progress=False) as (spark, _):
    assert spark.range(100, numPartitions=2).count() == 100
    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    options = list(runtime.getInputArguments())
    vm_info = spark.sparkContext._jvm.java.lang.System.getProperty("java.vm.info")
    pid = spark.sparkContext._gateway.proc.pid
    log_level = spark.sparkContext.getConf().get("spark.log.level")
print(json.dumps({"pid": pid, "options": options, "vm_info": vm_info, "log_level": log_level}))
"""


def start_a_session(cache: Path) -> dict:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    env.pop("EMBER_SPARK_CLASS_ARCHIVE", None)
    return run_a_session(env)[0]


def run_a_session(env: dict[str, str]) -> tuple[dict, str]:
    """What the child reports, and what it wrote to stderr (Spark's log)."""
    done = subprocess.run(
        [sys.executable, "-c", SESSION_OF_ITS_OWN],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict = json.loads(done.stdout.splitlines()[-1])
    return report, done.stderr


def test_a_session_ember_starts_logs_at_warn_from_its_first_line() -> None:
    report, log = run_a_session({**os.environ, "EMBER_SPARK_CLASS_ARCHIVE": "off"})
    assert report["log_level"] == "WARN"
    info = [line for line in log.splitlines() if " INFO " in line]
    assert not info, "\n".join(info[:10])


def test_the_first_session_lists_its_classes_and_the_next_starts_from_their_archive(
    tmp_path,
) -> None:
    cache = tmp_path / "a cache"  # Spark splits Java options at spaces unless quoted
    first = start_a_session(cache)
    listing = [o for o in first["options"] if o.startswith("-XX:DumpLoadedClassList=")]
    assert len(listing) == 1
    class_list = Path(listing[0].split("=", 1)[1])
    assert class_list.parent == cache / "ember"
    # A detached writer waits for the JVM to exit, then has java write the archive
    archives = lambda: list((cache / "ember").glob("spark-classes-*.jsa"))  # noqa: E731
    assert wait_for(lambda: bool(archives()), 300), "no archive within 300 s"
    [archive] = archives()
    assert int.from_bytes(archive.read_bytes()[:4], "little") == STATIC_ARCHIVE_MAGIC
    assert not class_list.exists()
    assert not psutil.pid_exists(first["pid"])

    second = start_a_session(cache)
    assert f"-XX:SharedArchiveFile={archive}" in second["options"]
    # A JVM that rejects the archive it is given runs with no shared class data at all
    assert "sharing" in second["vm_info"]
    assert not [o for o in second["options"] if o.startswith("-XX:DumpLoadedClassList")]
    assert wait_for(lambda: not psutil.pid_exists(second["pid"]), 60)
