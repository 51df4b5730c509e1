"""A Spark task's partition spilled to the executor's local disk and streamed from there:
what it trains on, and that no spill outlives its task or is found by a retried one. No Spark
here: a task's batches are Arrow record batches, made up below."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from ember.config import RunConfig
from ember.data.dataset import Dataset
from ember.data.spill import SPILL_PREFIX, partition_data, spill_folder
from ember.data.streamhost import StreamedDataset
from ember.errors import ConfigError
from ember.worker.data import shard_batches
from ember.worker.spec import WorkerSpec


@pytest.fixture
def local_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The executor's local directory, as Spark tells its Python workers."""
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{tmp_path},/elsewhere")
    return tmp_path


def batches(rows: int, per: int = 100) -> list[pa.RecordBatch]:
    """Rows whose two features are their id, in record batches as mapInArrow hands them."""
    ids = np.arange(rows)
    x = np.repeat(ids, 2).astype(np.float32)
    out = []
    for start in range(0, rows, per):
        stop = min(rows, start + per)
        offsets = pa.array(np.arange(0, 2 * (stop - start) + 1, 2, dtype=np.int32))
        features = pa.ListArray.from_arrays(offsets, pa.array(x[2 * start : 2 * stop]))
        out.append(pa.record_batch({"features": features, "label": ids[start:stop] % 2}))
    out.insert(1, out[0].slice(0, 0))  # Spark hands empty batches too
    return out


PROBE = Dataset("probe", *(np.zeros((4, 2), np.float32), np.zeros(4, np.int64)) * 2, 2, (2,))


def mode(data_mode: str) -> RunConfig:
    return RunConfig(data_mode=data_mode).validate()


def spills(root: Path) -> list[Path]:
    return sorted(root.glob(f"{SPILL_PREFIX}*"))


def test_a_streamed_partition_is_spilled_once_trained_on_and_removed(local_dir: Path) -> None:
    with partition_data(batches(950), PROBE, mode("stream"), rows=900) as partition:
        assert partition.rows == 950 and partition.x is None
        (spill,) = spills(local_dir)
        assert [p.name for p in spill.iterdir()] == ["partition.arrow"]
        data = partition.dataset(PROBE, 900)
        assert isinstance(data, StreamedDataset) and len(data.x_train) == 0
        config = RunConfig(workers=2, batch_size=50, data_mode="stream").validate()
        # rank 1 of 2 trains on its own partition's first 900 rows, not a half of them
        stream = shard_batches(WorkerSpec(config, 1, 2, own_rows=True), data)
        seen = np.concatenate([x[:, 0].numpy() for x, _ in stream.epoch(0)])
        assert np.array_equal(np.sort(seen), np.arange(900))
    assert spills(local_dir) == []


def test_a_spill_is_removed_when_the_task_fails(local_dir: Path) -> None:
    with (
        pytest.raises(RuntimeError, match="the step failed"),
        partition_data(batches(300), PROBE, mode("stream"), rows=None),
    ):
        assert len(spills(local_dir)) == 1
        raise RuntimeError("the step failed")
    assert spills(local_dir) == []


def test_a_retried_task_removes_spills_of_dead_workers_and_never_reuses_one(
    local_dir: Path,
) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    stale = local_dir / f"{SPILL_PREFIX}{dead.stdout.strip()}-attempt0"
    stale.mkdir()
    (stale / "partition.arrow").write_bytes(b"rows of an attempt that was killed")
    alive = local_dir / f"{SPILL_PREFIX}{os.getppid()}-another-task"  # a live worker's
    alive.mkdir()
    fresh = spill_folder()
    assert not stale.exists() and alive.exists()
    assert fresh.parent == local_dir and fresh.name.startswith(f"{SPILL_PREFIX}{os.getpid()}-")
    assert list(fresh.iterdir()) == []


def test_in_memory_mode_holds_the_partition_and_spills_nothing(local_dir: Path) -> None:
    with partition_data(batches(300), PROBE, mode("memory"), rows=300) as partition:
        assert partition.rows == 300 and partition.x is not None and partition.plan is None
        assert np.array_equal(partition.dataset(PROBE, 250).x_train[:, 0], np.arange(250))
    assert spills(local_dir) == []


def test_a_spill_damaged_mid_stream_is_one_error_naming_it_and_the_batch(local_dir: Path) -> None:
    with partition_data(batches(950), PROBE, mode("stream"), rows=900) as partition:
        (spill,) = spills(local_dir)
        file = spill / "partition.arrow"
        file.write_bytes(file.read_bytes()[:1000])
        config = RunConfig(workers=1, batch_size=50, data_mode="stream").validate()
        stream = shard_batches(WorkerSpec(config, 0, 1), partition.dataset(PROBE, 900))
        with pytest.raises(ConfigError, match=rf"spilled partition {file}, batch \d+: cannot"):
            list(stream.epoch(0))


# A task's Python worker as Spark runs it: spills its partition, then trains until killed.
SPILLING_TASK = """
import sys, time
import numpy as np
from ember.config import RunConfig
from ember.data.spill import partition_data
from tests.unit.test_spill import PROBE, batches
config = RunConfig(data_mode="stream").validate()
with partition_data(batches(300), PROBE, config, rows=None):
    print("spilled", flush=True)
    time.sleep(60)
"""


def test_a_spill_is_removed_when_its_task_is_killed_with_sigkill(local_dir: Path) -> None:
    # what Spark does to a cancelled task's Python worker (a Ctrl-C on the driver): no
    # `finally` runs in it; the janitor it started removes the spill
    task = subprocess.Popen(
        [sys.executable, "-c", SPILLING_TASK],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert task.stdout is not None and task.stdout.readline() == "spilled\n"
        (spill,) = spills(local_dir)
        assert (spill / "partition.arrow").stat().st_size > 0
        task.kill()
        task.wait(10)
        deadline = time.monotonic() + 10
        while spill.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not spill.exists()
    finally:
        task.kill()
        task.wait(10)


def test_auto_streams_a_partition_too_big_for_the_executor_and_says_why(
    local_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ember.data.spill

    with partition_data(batches(300), PROBE, mode("auto"), rows=300) as partition:
        assert partition.plan is None and partition.said == ""  # 300 rows fit
    monkeypatch.setattr(ember.data.spill, "AUTO_FRACTION", 10**12)  # now nothing does
    with partition_data(batches(300), PROBE, mode("auto"), rows=300) as partition:
        assert partition.plan is not None and len(spills(local_dir)) == 1
        assert partition.said.startswith("ember: data mode auto: the Spark tasks stream")
        assert "GiB of training rows a task" in partition.said
    assert spills(local_dir) == []


def test_a_spilled_partition_of_values_streams_its_float_targets(local_dir: Path) -> None:
    # a regression's partition: two values a row (a list column), each the row's id + 0.5
    values = []
    for batch in batches(300):
        ids = batch.column("features").flatten().to_numpy()[::2]
        label = pa.array(list(np.stack([ids + 0.5, ids + 0.5], axis=1)), pa.list_(pa.float32()))
        values.append(pa.record_batch({"features": batch.column("features"), "label": label}))
    probe = Dataset("probe", *(np.zeros((4, 2), np.float32), np.zeros((4, 2), np.float32)) * 2,
                    2, (2,))  # fmt: skip
    with partition_data(values, probe, mode("stream"), rows=300) as partition:
        assert partition.plan is not None and partition.plan.targets == "values"
        config = RunConfig(workers=1, batch_size=50, data_mode="stream", loss="mse").validate()
        stream = shard_batches(WorkerSpec(config, 0, 1), partition.dataset(probe, 300))
        for x, y in stream.epoch(0):
            assert tuple(y.shape) == (50, 2) and np.allclose(y[:, 1].numpy(), x[:, 0] + 0.5)
    assert spills(local_dir) == []
