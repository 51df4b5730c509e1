"""Whether a local run streams its training rows from disk (--data-mode), and the launcher's
and workers' sides of it: a plan of the files instead of a copy of the rows, the test split
alone held in memory.

imports: numpy and the data part (pyarrow lazily, through stream.py)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ember.config import DataPart, RunConfig
from ember.config.objective import targets_of
from ember.data.dataset import Dataset
from ember.data.datasets import DATASET_NAMES
from ember.data.host import HostData, _scratch, host_data
from ember.data.idx import find_idx_files
from ember.data.store import DataFiles, Mode, NpyWriter, write_array
from ember.data.stream import StreamPlan, plan_files, plan_npy, read_piece
from ember.errors import ConfigError

if TYPE_CHECKING:  # torch's: a local run's launcher imports this module, and never torch
    from ember.data.batches import ShardBatches
    from ember.data.streaming import Counted

AUTO_FRACTION = 4  # auto streams training rows bigger than 1/AUTO_FRACTION of the memory


@dataclass(frozen=True, eq=False)
class StreamedDataset(Dataset):
    """A dataset whose training rows stay on disk: x_train and y_train hold none of them
    (zero rows of the right shape) and `plan` says where they are; the test split is held."""

    plan: StreamPlan | None = None
    whole: bool = True  # the plan holds every worker's rows, else this worker's own
    groups: tuple[int, ...] = ()  # rows of each stored piece of the user's files (see StreamFiles)

    def __post_init__(self) -> None:
        if self.plan is None or len(self.x_train) or len(self.y_train):
            raise ConfigError(f"dataset {self.name}: a streamed dataset holds no training rows")
        # the test split checked as any dataset's
        Dataset(self.name, self.x_test, self.y_test, self.x_test, self.y_test, self.num_classes,
                self.input_shape)  # fmt: skip


@dataclass(frozen=True)
class StreamFiles(DataFiles):
    """DataFiles whose training rows are `plan`'s pieces, read by each worker as it trains;
    `arrays` holds the test split's .npy files (and, streamed from .npy, the training ones)."""

    plan: StreamPlan | None = None
    # Rows of each stored piece as the user's files hold them (Parquet row groups), where
    # `plan` reads a copy laid out otherwise: a worker range deals pieces by these, so that
    # a member reading the files themselves (a joiner, a Spark task) cuts them the same way.
    groups: tuple[int, ...] = ()

    def dataset(self, mode: Mode = "r") -> Dataset:
        a, empty = self.arrays, np.empty((0, *self.input_shape), dtype=np.float32)
        return StreamedDataset(
            self.name,
            empty,
            no_targets(self.plan) if self.plan else np.empty(0, np.int64),
            a["x_test"].rows(0, self.test_rows, mode),
            a["y_test"].rows(0, self.test_rows, mode),
            self.num_classes,
            self.input_shape,
            plan=self.plan,
            groups=self.groups,
        )

    def shard(self, rank: int, world: int) -> Dataset:
        """Every worker the same: which pieces are its own, stream_batches works out."""
        return self.dataset("r")


def host_run_data(config: RunConfig, say: Callable[[str], None]) -> HostData:
    """config.data for this host's workers under config.data_mode: laid out once to map
    (memory), or planned to stream from its files (stream; auto when it is big)."""
    mode, path = config.data_mode, Path(config.data).expanduser()
    if config.data not in DATASET_NAMES and _streamable(path):
        if mode == "memory" and _npz_only(path):
            raise ConfigError(
                f"data path {path}: a folder of .npz shards is only streamed; pass"
                " --data-mode stream or auto"
            )
        plans = _file_plans(path, mode, targets_of(config.loss)) if mode != "memory" else None
        if plans and (mode == "stream" or _too_big(config.data, plans[0], say)):
            return _hosted(config.data, *plans, say)
    host = host_data(
        config.data,
        seed=config.seed,
        synthetic_samples=config.synthetic_samples,
        synthetic_features=config.synthetic_features,
        targets=targets_of(config.loss),
    )
    files = host.files
    a = files.arrays
    plan = plan_npy(a["x_train"], a["y_train"], files.train_rows, files.num_classes)
    if mode == "stream" or (mode == "auto" and _too_big(files.name, plan, say)):
        fields = {k: getattr(files, k) for k in DataFiles.__dataclass_fields__}
        return HostData(StreamFiles(**fields, plan=plan), host.scratch)
    return host


def parquet_files_to_stream(config: RunConfig, say: Callable[[str], None]) -> list[Path]:
    """The Parquet files a Spark run under config.data_mode reads in its tasks rather than
    on the driver: [train, test] of a folder holding that split, [path] for any other
    Parquet file or folder; [] when the rows are loaded on the driver (memory, not
    Parquet, or auto with rows that fit)."""
    mode, path = config.data_mode, Path(config.data).expanduser()
    if mode == "memory" or config.data in DATASET_NAMES or not _streamable(path):
        return []
    if path.is_dir() and not any(path.rglob("*.parquet")):
        return []  # .npz shards: loaded on the driver
    plans = _file_plans(path, mode, targets_of(config.loss))
    if plans is None or (mode == "auto" and not _too_big(config.data, plans[0], say)):
        return []
    train, test = path / "train.parquet", path / "test.parquet"
    return [train, test] if path.is_dir() and train.exists() and test.exists() else [path]


def training_plan(path: str, targets: str | None) -> StreamPlan:
    """The training rows of a data path that streams, as every host plans them from the
    files themselves (a Spark task's, which the driver does not lay out)."""
    return _planned_split(Path(path).expanduser(), targets)[0]


def no_targets(plan: StreamPlan) -> np.ndarray:
    """Zero rows of `plan`'s targets: a streamed dataset's y_train."""
    dtype = np.int64 if plan.targets == "classes" else np.float32
    return np.empty((0, *plan.target_shape), dtype=dtype)


def stream_batches(
    dataset: StreamedDataset, rank: int, world: int, data: DataPart, batch_size: int
) -> Counted:
    """Worker `rank`'s share of the dataset's pieces, streamed as batches of `batch_size`,
    shuffled as the run's data part says."""
    from ember.data.streaming import Counted, StreamBatches

    assert dataset.plan is not None  # StreamedDataset insists
    plan = dataset.plan
    pieces = plan.shard(rank, world, data.seed) if dataset.whole else plan.pieces
    rows = sum(p.rows for p in pieces)
    if rows < batch_size:
        raise ConfigError(
            f"worker {rank}: shard of {rows} rows is smaller than one batch of {batch_size}"
        )
    inner = StreamBatches(
        pieces,
        dataset.input_shape,
        dataset.num_classes,
        batch_size,
        data.seed,
        rank,
        data.shuffle_buffer,
        (plan.targets, plan.target_shape),
    )
    return Counted(inner, "stream")


def counted(batches: ShardBatches) -> Counted:
    """In-memory batches with the same counters a stream keeps."""
    from ember.data.streaming import Counted

    return Counted(batches, "memory")


def _streamable(path: Path) -> bool:
    if path.is_file():
        return path.suffix == ".parquet"
    if not path.is_dir() or find_idx_files(path):
        return False
    return any(path.rglob("*.parquet")) or any(path.rglob("*.npz"))


def _npz_only(path: Path) -> bool:
    return path.is_dir() and not any(path.rglob("*.parquet")) and any(path.rglob("*.npz"))


def _file_plans(path: Path, mode: str, targets: str | None) -> tuple[StreamPlan, StreamPlan] | None:
    """The training rows to stream and the test rows to hold: train.parquet and test.parquet
    when the folder has both, else the last max(1, n // 10) rows held out, as in memory.
    Under auto, None for files that cannot be planned: loading them says why, in full."""
    try:
        return _planned_split(path, targets)
    except ConfigError:
        if mode == "auto":
            return None
        raise


def _planned_split(path: Path, targets: str | None) -> tuple[StreamPlan, StreamPlan]:
    """The training and test rows of `path`: a folder's train.parquet and test.parquet
    (each a file, or a folder of them as Spark writes one), else its last rows held out."""
    train, test = path / "train.parquet", path / "test.parquet"
    if path.is_dir() and train.exists() and test.exists():
        return plan_files(train, targets), plan_files(test, targets)
    whole = plan_files(path, targets)
    if whole.rows < 2:
        raise ConfigError(f"data path {path}: only {whole.rows} row; need 2 to hold out a test set")
    return whole.split(whole.rows - max(1, whole.rows // 10))


def _too_big(name: str, plan: StreamPlan, say: Callable[[str], None]) -> bool:
    row = int(np.prod(plan.input_shape)) * 4 + 8
    size, memory = plan.rows * row, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if size * AUTO_FRACTION <= memory:
        return False
    say(
        f"ember: data mode auto: streaming {name} from disk ({size / 2**30:.1f} GiB of"
        f" training rows, more than 1/{AUTO_FRACTION} of this machine's"
        f" {memory / 2**30:.1f} GiB of memory)"
    )
    return True


def _hosted(name: str, train: StreamPlan, test: StreamPlan, say: Callable[[str], None]) -> HostData:
    """Plans of a user's files: the test rows read into .npy files (small); the training
    rows decoded once into .npy files on this machine's disk when it has the room (see
    _lay_out), else left where they are."""
    held = [read_piece(piece, train.input_shape, train.targets) for piece in test.pieces]
    x, y = np.concatenate([h[0] for h in held]), np.concatenate([h[1] for h in held])
    if tuple(y.shape[1:]) != train.target_shape:
        raise ConfigError(
            f"data path {name}: the test rows' targets have shape {tuple(y.shape[1:])}, the"
            f" training rows' {train.target_shape}"
        )
    classes = max(train.num_classes, int(y.max()) + 1) if train.targets == "classes" else 0
    classes = classes or train.num_classes
    groups = tuple(p.rows for p in train.pieces)
    decoded = _decoded_bytes(train)
    laying_out = any(p.kind == "parquet" for p in train.pieces) and _disk_room(decoded)
    # removed with the run, as host_data's copies: on disk when the training rows go there
    scratch = _scratch(x.nbytes + y.nbytes, on_disk=laying_out)
    try:
        arrays = {
            "x_test": write_array(scratch / "x_test.npy", x),
            "y_test": write_array(scratch / "y_test.npy", y),
        }
        if laying_out:
            say(
                f"ember: streaming {name} from a copy decoded once into {scratch}"
                f" ({decoded / 2**30:.1f} GiB; removed when the run ends)"
            )
            train = _lay_out(train, scratch)
        files = StreamFiles(
            name, arrays, train.rows, len(y), classes, train.input_shape, plan=train, groups=groups
        )
        return HostData(files, scratch)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise


def _decoded_bytes(plan: StreamPlan) -> int:
    """What `plan`'s rows take as float32 features and their targets."""
    target = 8 if plan.targets == "classes" else 4 * int(np.prod(plan.target_shape))
    return plan.rows * (4 * int(np.prod(plan.input_shape)) + target)


def _disk_room(needed: int) -> bool:
    """Whether the temporary directory's disk (TMPDIR; never shared memory, where a copy
    would be memory) holds twice `needed` bytes free."""
    return shutil.disk_usage(tempfile.gettempdir()).free > 2 * needed + (1 << 30)


def _lay_out(train: StreamPlan, folder: Path) -> StreamPlan:
    """Decode `train`'s Parquet row groups once, a piece at a time, into .npy files in
    `folder`, and plan them. Decoding a Parquet row costs the read-ahead thread about seven
    times what copying it from an .npy file does (docs/data.md, "What a streamed row
    costs"); once, before training, instead of every epoch, the stream runs at nearly the
    in-memory speed, its memory as bounded as before."""
    shape, dtype = train.input_shape, np.int64 if train.targets == "classes" else np.float32
    xs = NpyWriter(folder / "x_train.npy", np.dtype(np.float32), (train.rows, *shape))
    ys = NpyWriter(folder / "y_train.npy", np.dtype(dtype), (train.rows, *train.target_shape))
    for piece in train.pieces:
        x, y = read_piece(piece, shape, train.targets)
        xs.write(x)
        ys.write(y)
    plan = plan_npy(xs.close(), ys.close(), train.rows, train.num_classes)
    return replace(plan, targets=train.targets)


__all__ = [
    "StreamFiles",
    "StreamedDataset",
    "counted",
    "host_run_data",
    "no_targets",
    "parquet_files_to_stream",
    "stream_batches",
    "training_plan",
]
