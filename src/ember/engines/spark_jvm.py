"""Java options for the local JVM of a SparkSession ember starts itself, and the class-data
archive that halves its start.

Most of what such a JVM spends after it starts is loading and verifying Spark's classes, the
same ones every run. HotSpot can keep them in a class-data archive (CDS) that later JVMs map
instead. The first run only lists the classes its JVM loads (which costs it little); once that
JVM has exited, a detached process has java write the archive from the list (half a minute of
one core) and moves it into place whole. Later runs start from it. The archive depends on the
Java runtime and the Spark jars, so its name carries a key of both.

Run as `python spark_jvm.py JVM_PID JAVA CLASSPATH CLASS_LIST ARCHIVE` to write it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import psutil

# This JVM only hands the data to the tasks, once: the optimizing JIT compiler and the
# parallel collector would spend more CPU than they save (about a second of a run).
SHORT_LIVED = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
# Locally the data passes through this JVM's heap in several copies (Spark's 1g default
# holds MNIST once, not twice); a ceiling, not a reservation.
LOCAL_DRIVER_MEMORY = "4g"
ARCHIVE_SWITCH = "EMBER_SPARK_CLASS_ARCHIVE"  # "off": no class-data archive
_PREFIX = "spark-classes-"
WRITE_TIMEOUT = 600.0  # for the JVM to exit, and again for java to write the archive


class ClassArchive:
    """The archive for this Java runtime and these Spark jars, in the user's cache folder."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.failed = path.with_suffix(".failed")  # java could not write it: do not retry
        self.writing = path.with_suffix(".writing")  # the process id of the writer at work
        # this process's list of the classes its JVM loads, when there is no archive yet
        self.class_list = path.with_suffix(f".{os.getpid()}.classlist")

    def java_options(self) -> str:
        """Start from the archive, or list the loaded classes to write one from."""
        # quoted: Spark splits the options at spaces, and a home folder may hold some
        if self.path.exists():
            # -Xlog:cds*=off: an archive of a changed runtime is skipped, not reported
            return f"{shlex.quote(f'-XX:SharedArchiveFile={self.path}')} -Xlog:cds*=off"
        if self.failed.exists() or self._being_written():
            return ""
        return shlex.quote(f"-XX:DumpLoadedClassList={self.class_list}")

    def _being_written(self) -> bool:
        try:
            return psutil.pid_exists(int(self.writing.read_text()))
        except (OSError, ValueError):
            return False

    def write_after(self, jvm_pid: int) -> None:
        """When this process's JVM listed its classes: start the detached writer, which waits
        for that JVM to exit (the list is complete then) and writes the archive."""
        if not self.class_list.exists():
            return
        try:
            command = psutil.Process(jvm_pid).cmdline()
            classpath = command[command.index("-cp") + 1]
        except (psutil.Error, ValueError, IndexError):
            self.class_list.unlink(missing_ok=True)
            return
        arguments = [str(jvm_pid), command[0], classpath, str(self.class_list), str(self.path)]
        writer = subprocess.Popen(
            # as a script: the writer needs none of ember's imports (PyTorch above all)
            [sys.executable, str(Path(__file__).resolve()), *arguments],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # outlives this process, and its Ctrl-C
        )
        self.writing.write_text(str(writer.pid))  # meanwhile, later runs neither list nor write


def class_archive() -> ClassArchive | None:
    """None when switched off, or without a Java runtime or a folder to keep the archive in."""
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
    return ClassArchive(folder / f"{_PREFIX}{key}.jsa") if os.access(folder, os.W_OK) else None


def java_binary() -> Path | None:
    """The java Spark's launcher runs: JAVA_HOME's, else the first on PATH; None if none."""
    java = os.path.join(os.environ.get("JAVA_HOME", ""), "bin", "java")
    found = java if os.access(java, os.X_OK) else shutil.which("java")
    return Path(found).resolve() if found else None


def local_driver_options(archive: ClassArchive | None) -> str:
    """spark.driver.extraJavaOptions for a local session of ember's own."""
    return f"{SHORT_LIVED} {archive.java_options()}".strip() if archive else SHORT_LIVED


def write_archive(jvm_pid: int, java: str, classpath: str, classes: Path, archive: Path) -> int:
    """Once the JVM that listed `classes` has exited, have `java` write the archive beside
    `archive` and move it into place whole; a failure leaves a marker instead."""
    target = ClassArchive(archive)
    partial = archive.with_suffix(f".{os.getpid()}.partial")
    dump = [java, "-Xshare:dump", f"-XX:SharedClassListFile={classes}", "-Xlog:cds*=off"]
    try:
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(jvm_pid).wait(WRITE_TIMEOUT)
        done = subprocess.run(
            [*dump, f"-XX:SharedArchiveFile={partial}", "-cp", classpath],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=WRITE_TIMEOUT,
        )
        if done.returncode != 0 or not partial.exists():
            target.failed.write_text(f"java exited with {done.returncode}\n")
            return 1
        for stale in archive.parent.glob(f"{_PREFIX}*.jsa"):  # other runtimes' or Sparks'
            stale.unlink(missing_ok=True)
        os.replace(partial, archive)
        return 0
    except (psutil.TimeoutExpired, subprocess.TimeoutExpired):
        return 1
    finally:
        for leftover in (partial, classes, target.writing):
            leftover.unlink(missing_ok=True)


if __name__ == "__main__":
    pid, java_path, cp, listed, target = sys.argv[1:6]
    sys.exit(write_archive(int(pid), java_path, cp, Path(listed), Path(target)))
