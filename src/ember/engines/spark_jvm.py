"""Java options for the local JVM of a SparkSession ember starts itself.

Most of what such a JVM spends after it starts is loading and verifying Spark's classes, the
same ones every run. HotSpot can keep them in a class-data archive (CDS) that later JVMs map
instead: the first run writes it as its JVM exits, later runs start with it. The archive
depends on the Java runtime and the Spark jars, so its name carries a key of both.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
from pathlib import Path

# This JVM only hands the data to the tasks, once: the optimizing JIT compiler and the
# parallel collector would spend more CPU than they save (about a second of a run).
SHORT_LIVED = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
# Locally the data passes through this JVM's heap in several copies (Spark's 1g default
# holds MNIST once, not twice); a ceiling, not a reservation.
LOCAL_DRIVER_MEMORY = "4g"
ARCHIVE_SWITCH = "EMBER_SPARK_CLASS_ARCHIVE"  # "off": no class-data archive
_ARCHIVE_PREFIX = "spark-classes-"


def local_driver_options() -> str:
    """spark.driver.extraJavaOptions for a local session: SHORT_LIVED, and the class-data
    archive to start from, or to write at exit when there is none yet."""
    archive = class_archive()
    if archive is None:
        return SHORT_LIVED
    if archive.exists():
        # A file still being written has an empty header until its last write, and the
        # JVM then starts without it; a complete one whose runtime changed is skipped too.
        flag = f"-XX:SharedArchiveFile={archive}"
    else:
        _remove_other_archives(archive)
        flag = f"-XX:ArchiveClassesAtExit={archive}"
    # -Xlog:cds*=off: the JVM would print a line for each class it cannot archive
    return f"{SHORT_LIVED} {shlex.quote(flag)} -Xlog:cds*=off"


def class_archive() -> Path | None:
    """Where the archive for this Java runtime and these Spark jars lives (in the user's
    cache folder); None when switched off, or without a Java or a folder to keep it in."""
    if os.environ.get(ARCHIVE_SWITCH, "").strip().lower() in ("off", "0", "false", "no"):
        return None
    java = java_binary()
    if java is None:
        return None
    import pyspark

    facts = [str(java), str(java.stat().st_mtime_ns), pyspark.__version__, pyspark.__file__]
    facts.append(os.environ.get("SPARK_HOME", ""))
    key = hashlib.sha256("\n".join(facts).encode()).hexdigest()[:16]
    folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ember"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return folder / f"{_ARCHIVE_PREFIX}{key}.jsa" if os.access(folder, os.W_OK) else None


def java_binary() -> Path | None:
    """The java Spark's launcher runs: JAVA_HOME's, else the first on PATH; None if none."""
    java = os.path.join(os.environ.get("JAVA_HOME", ""), "bin", "java")
    found = java if os.access(java, os.X_OK) else shutil.which("java")
    return Path(found).resolve() if found else None


def _remove_other_archives(archive: Path) -> None:
    """Archives of another runtime or Spark version are never read again (about 150 MB each)."""
    for stale in archive.parent.glob(f"{_ARCHIVE_PREFIX}*.jsa"):
        if stale != archive:
            stale.unlink(missing_ok=True)
