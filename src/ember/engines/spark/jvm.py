"""Java options for the local JVM of a SparkSession ember starts itself, and the class-data
archive that halves its start.

Most of what such a JVM spends after it starts is loading and verifying Spark's classes, the
same ones every run. HotSpot can keep them in a class-data archive (CDS) that later JVMs map
instead. The first run only lists the classes its JVM loads (which costs it little); once that
JVM has exited, a detached process has java write the archive from the list (half a minute of
one core) and moves it into place whole: HotSpot 17 crashes on a truncated archive, so nothing
incomplete ever carries the archive's name. Later runs start from it. The archive depends on
the Java runtime and the Spark jars, so its name carries a key of both. Every step is optional:
whatever goes wrong, the run goes on without the archive.

Run as `python jvm.py JVM_PID JAVA CLASSPATH CLASS_LIST ARCHIVE` to write it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
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
_LEFTOVER = re.compile(rf"{_PREFIX}\w+\.(\d+)\.(classlist|partial)")  # named by their process
JVM_EXIT_TIMEOUT = 86400.0  # the JVM lives as long as its Python process, a notebook's too
DUMP_TIMEOUT = 600.0  # for java to write the archive
UNUSED_DAYS = 30  # another runtime's or Spark's archive is removed when unused this long


class ClassArchive:
    """The archive for this Java runtime and these Spark jars, in the user's cache folder, and
    the files around it: `claim` names the one process listing classes or writing the archive
    (so concurrent runs do neither twice), `failed` says java could not write it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.failed = path.with_suffix(".failed")  # delete it to let ember try again
        self.claim = path.with_suffix(".claim")
        self.class_list = path.with_suffix(f".{os.getpid()}.classlist")

    def java_options(self) -> str:
        """Start from the archive, or list the loaded classes to write one from."""
        try:
            # quoted: Spark splits the options at spaces, and a home folder may hold some
            if self.path.exists():
                os.utime(self.path)  # its time is when a run last used it
                # -Xlog:cds*=off: an archive of a changed runtime is skipped, not reported
                return f"{shlex.quote(f'-XX:SharedArchiveFile={self.path}')} -Xlog:cds*=off"
            if self.failed.exists() or not self._take_claim():
                return ""
            return shlex.quote(f"-XX:DumpLoadedClassList={self.class_list}")
        except OSError:
            return ""

    def _take_claim(self) -> bool:
        holder = self.claim.read_text() if self.claim.exists() else ""
        if holder and _alive(holder):
            return False
        self.claim.unlink(missing_ok=True)  # its holder is gone
        try:
            descriptor = os.open(self.claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:  # another run took it just now
            return False
        with os.fdopen(descriptor, "w") as claim:
            claim.write(_identity(os.getpid()))
        return True

    def write_after(self, jvm_pid: int) -> None:
        """When this process's JVM listed its classes: hand the claim to a detached writer,
        which waits for that JVM to exit (the list is complete then) and writes the archive."""
        if not self.class_list.exists():
            return
        try:
            command = psutil.Process(jvm_pid).cmdline()
            java, classpath = command[0], command[command.index("-cp") + 1]
            arguments = [str(jvm_pid), java, classpath, str(self.class_list), str(self.path)]
            writer = subprocess.Popen(
                # as a script: the writer needs none of ember's imports (PyTorch above all)
                [sys.executable, str(Path(__file__).resolve()), *arguments],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # outlives this process, and its Ctrl-C
            )
            self.claim.write_text(_identity(writer.pid))
        except (OSError, ValueError, IndexError, psutil.Error):
            self.discard()

    def discard(self) -> None:
        """No archive comes of this process's list: remove it, and give up the claim."""
        with contextlib.suppress(OSError):
            self.class_list.unlink(missing_ok=True)
            if self.claim.exists() and self.claim.read_text() == _identity(os.getpid()):
                self.claim.unlink()


def class_archive() -> ClassArchive | None:
    """None when switched off, off POSIX, or without a Java runtime or a writable folder."""
    if os.environ.get(ARCHIVE_SWITCH, "").strip().lower() in ("off", "0", "false", "no"):
        return None
    if os.name != "posix":  # Spark starts java through a script there: no JVM pid to wait on
        return None
    try:
        java = java_binary()
        if java is None:
            return None
        import pyspark

        facts = [str(java), str(java.stat().st_mtime_ns), pyspark.__version__, pyspark.__file__]
        facts.append(os.environ.get("SPARK_HOME", ""))
        key = hashlib.sha256("\n".join(facts).encode()).hexdigest()[:16]
        folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ember"
        folder.mkdir(parents=True, exist_ok=True)
    except (OSError, RuntimeError):  # RuntimeError: no home folder to be found
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


def _identity(pid: int) -> str:
    """A process id and its start time: a pid alone may name a later process after a reboot."""
    return f"{pid} {psutil.Process(pid).create_time()}"


def _alive(identity: str) -> bool:
    try:
        pid = int(identity.split()[0])
        return _identity(pid) == identity.strip()
    except (ValueError, IndexError, psutil.Error):
        return False


def write_archive(jvm_pid: int, java: str, classpath: str, classes: Path, archive: Path) -> int:
    """Once the JVM that listed `classes` has exited, have `java` write the archive beside
    `archive` and move it into place whole; a failure leaves a marker instead."""
    files = ClassArchive(archive)
    partial = archive.with_suffix(f".{os.getpid()}.partial")
    dump = [java, "-Xshare:dump", f"-XX:SharedClassListFile={classes}", "-Xlog:cds*=off"]
    try:
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(jvm_pid).wait(JVM_EXIT_TIMEOUT)
        _remove_leftovers(archive, classes)
        if archive.exists():  # another writer was quicker
            return 0
        done = subprocess.run(
            [*dump, f"-XX:SharedArchiveFile={partial}", "-cp", classpath],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=DUMP_TIMEOUT,
        )
        if done.returncode != 0 or not partial.exists():
            files.failed.write_text(f"java -Xshare:dump exited with {done.returncode}\n")
            return 1
        with partial.open("rb") as written:  # on disk before it carries the archive's name
            os.fsync(written.fileno())
        os.replace(partial, archive)
        return 0
    except (OSError, psutil.TimeoutExpired, subprocess.TimeoutExpired):
        return 1
    finally:
        partial.unlink(missing_ok=True)
        classes.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            if files.claim.read_text() == _identity(os.getpid()):
                files.claim.unlink()


def _remove_leftovers(archive: Path, classes: Path) -> None:
    """Class lists and partial archives of processes that are gone (but `classes`, which this
    writer reads), and the archives of other runtimes or Spark versions unused for
    UNUSED_DAYS (about 180 MB each)."""
    unused_since = time.time() - UNUSED_DAYS * 86400
    for path in archive.parent.glob(f"{_PREFIX}*"):
        if path == classes:
            continue
        leftover = _LEFTOVER.fullmatch(path.name)
        orphan = leftover is not None and not psutil.pid_exists(int(leftover.group(1)))
        unused = path.suffix == ".jsa" and path != archive and path.stat().st_mtime < unused_since
        if orphan or unused:
            path.unlink(missing_ok=True)


if __name__ == "__main__":
    pid, java_path, cp, listed, archive_path = sys.argv[1:6]
    sys.exit(write_archive(int(pid), java_path, cp, Path(listed), Path(archive_path)))
