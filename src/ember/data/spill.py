"""A Spark task's partition as its worker's training rows: held in memory, or (--data-mode
stream) spilled once to an Arrow IPC file on the executor's local disk and streamed from it,
the file removed when the task ends however it ends.

imports: numpy, pyarrow (lazily) and the data part; never pyspark
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ember.config import DataPart, RunConfig
from ember.data.arrow import WEIGHT, partition_arrays
from ember.data.dataset import Dataset
from ember.data.stream import Piece, StreamPlan
from ember.data.streamhost import AUTO_FRACTION, StreamedDataset, no_targets
from ember.errors import EmberError

SPILL_PREFIX = "ember-spill-"  # then the pid of the Python worker that wrote it

# Run beside a task that spills: removes the spill once the task's Python worker is gone,
# however it went. Spark kills a cancelled task's worker with SIGKILL (a Ctrl-C on the
# driver, a stage cancelled), and no `finally` of its own runs then. It ends by itself when
# the folder is gone (the task removed it) or the worker is.
JANITOR = """
import os, select, shutil, sys, time
folder, pid = sys.argv[1], int(sys.argv[2])
try:
    handle = os.pidfd_open(pid)
except (AttributeError, OSError):
    handle = None
while os.path.isdir(folder):
    if handle is not None:
        if select.select([handle], [], [], 1.0)[0]:
            break
    else:
        time.sleep(1.0)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
shutil.rmtree(folder, ignore_errors=True)
"""


@dataclass
class Partition:
    """A task's rows: `x` and `y` in memory, or `plan`'s pieces of a spill file."""

    rows: int
    x: np.ndarray | None = None
    y: np.ndarray | None = None
    w: np.ndarray | None = None  # the rows' weights, where the frame has a weight column
    plan: StreamPlan | None = None
    said: str = ""  # why data mode auto streams it: one line for the driver to print

    def dataset(self, probe: Dataset, rows: int) -> Dataset:
        """The first `rows` of the partition to train on, with `probe`'s test rows."""
        if self.plan is None:
            assert self.x is not None and self.y is not None
            w = self.w[:rows] if self.w is not None else None
            return replace(
                probe, name="partition", x_train=self.x[:rows], y_train=self.y[:rows], w_train=w
            )
        empty = np.empty((0, *probe.input_shape), np.float32)
        return StreamedDataset(
            "partition",
            empty,
            no_targets(self.plan),
            probe.x_test,
            probe.y_test,
            probe.num_classes,
            probe.input_shape,
            plan=self.plan.split(rows)[0],
            whole=False,  # this worker's own rows: nothing to split among workers here
        )


@contextlib.contextmanager
def partition_data(
    batches: Iterable[Any], probe: Dataset, data: DataPart | RunConfig, rows: int | None
) -> Iterator[Partition]:
    """The partition's Arrow `batches` as a Partition while the task trains. Under the run's
    --data-mode stream it spills; under auto when the `rows` each worker trains on (None: not
    known) would take more than 1/AUTO_FRACTION of this host's memory."""
    shape, mode = tuple(probe.input_shape), data.data_mode
    said = _too_big(rows, shape) if mode == "auto" else ""
    if mode == "memory" or (mode == "auto" and not said):
        x, y, w = partition_arrays(batches, shape, like=probe)
        yield Partition(len(x), x, y, w)
        return
    folder = spill_folder()
    janitor = start_janitor(folder)
    try:
        pieces = spill_batches(batches, folder / "partition.arrow")
        if pieces and WEIGHT in _schema_names(pieces[0].path):
            raise EmberError(
                "a weight column trains from rows held in memory, and this partition streams"
                f" from disk ({said or 'data mode stream'}): use --data-mode memory, or more"
                " workers for smaller partitions"
            )
        targets = "classes" if probe.y_test.dtype == np.int64 else "values"
        plan = StreamPlan(pieces, shape, probe.num_classes, targets, probe.y_test.shape[1:])
        yield Partition(plan.rows, plan=plan, said=said)
    finally:  # success, an error, or the generator closed by a cancelled task
        shutil.rmtree(folder, ignore_errors=True)
        janitor.kill()
        janitor.wait(10)


def _schema_names(path: str) -> list[str]:
    import pyarrow as pa

    with pa.ipc.open_file(path) as reader:
        return list(reader.schema.names)


def start_janitor(folder: Path) -> subprocess.Popen[bytes]:
    """A process that removes `folder` when this one dies (JANITOR). A session of its own:
    what kills this process's group leaves it to do its work."""
    return subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", JANITOR, str(folder), str(os.getpid())],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def spill_folder() -> Path:
    """A new folder for this task attempt's spill on the executor's first local directory
    (SPARK_LOCAL_DIRS, which Spark sets for its Python workers, else the temporary one), after
    removing those that Python workers no longer alive left there (killed, or a stage retried
    after a crash): a retried task never finds, let alone reuses, an older attempt's rows."""
    local = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0] or tempfile.gettempdir()
    root = Path(local)
    for old in root.glob(f"{SPILL_PREFIX}*"):
        pid = old.name[len(SPILL_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{SPILL_PREFIX}{os.getpid()}-", dir=root))


def spill_batches(batches: Iterable[Any], path: Path) -> tuple[Piece, ...]:
    """Write the record batches to one Arrow IPC file as they arrive (one batch in memory at
    a time); each batch becomes a piece."""
    import pyarrow as pa

    pieces: list[Piece] = []
    writer = None
    try:
        for batch in batches:
            if writer is None:
                writer = pa.ipc.new_file(str(path), batch.schema)
            writer.write_batch(batch)
            # the piece's index is the batch's in the file: empty ones are written too
            pieces.append(Piece("ipc", str(path), len(pieces), 0, batch.num_rows))
    finally:
        if writer is not None:
            writer.close()
    return tuple(p for p in pieces if p.rows)


def _too_big(rows: int | None, shape: tuple[int, ...]) -> str:
    """Why `rows` rows of `shape` are streamed under auto on this executor; "" if they fit."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    size = (rows or 0) * (int(np.prod(shape)) * 4 + 8)
    if size * AUTO_FRACTION <= memory:
        return ""
    return (
        f"ember: data mode auto: the Spark tasks stream their partitions from the executors'"
        f" local disks ({size / 2**30:.1f} GiB of training rows a task, more than"
        f" 1/{AUTO_FRACTION} of an executor host's {memory / 2**30:.1f} GiB of memory)"
    )


__all__ = ["Partition", "partition_data", "spill_folder", "start_janitor"]
