"""startup: from command to trained model, and the memory a run holds, side by side.

Each repeat runs, back to back and in rotating order:
- **ember**: `python -m ember train --epochs E` as a command (MNIST, mlp, the default strategy
  easgd-async, 2 workers, local engine); its wall time, and that less its `train_seconds`.
- **plain**: `python -c` a plain PyTorch script that imports torch, reads the same MNIST gzips
  with gzip and NumPy, trains the same mlp (SGD lr 0.05, momentum 0.9, batch 64) for E epochs
  on all 60,000 images with 2 threads, and evaluates; its wall time.
- **distributor**: PySpark's `TorchDistributor(num_processes=2, local_mode=True).run` of the
  same job as 2 DDP (gloo) processes on half the images each; its wall time, without the
  Spark session's start (made before the timer starts, in a child process of its own).

Then the peak memory summed over a run's processes (summary.json `peak_memory_bytes`): `ember
train --data synthetic-lr` with 1,000,000 x 100 float32 rows (400 MB) and 1, 2 and 4 workers,
against the same with 1,000 rows; the difference over the data's size is the figure to watch
(one copy of the data per host: about 1x).

--quick runs one repeat of 1 epoch, the memory rows at 100,000 x 100 with 1 and 2 workers.

Usage: python lab/benchmarks/startup.py [--epochs E] [--repeat R] [--quick] [--out F]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import call_in_child, fmt, make_parser, markdown_table, positive_int, report, spread
from ember.probe import MNIST_DIR

EPOCHS = 5
TIMEOUT = 900.0  # seconds any one command may take
TARGETS = {"plain": 0.6, "distributor": 0.3}  # ember's wall over theirs, at most
OVERHEAD_TARGET = 2.0  # seconds of the ember command besides training, at most

PLAIN = r"""
import gzip, sys, time
import numpy as np
import torch
import torch.nn.functional as F

torch.set_num_threads(2)
folder, epochs = sys.argv[1], int(sys.argv[2])

def idx(name, offset):
    return np.frombuffer(gzip.open(f"{folder}/{name}.gz").read(), np.uint8, offset=offset)

def images(name):
    x = idx(name, 16).astype(np.float32).reshape(-1, 1, 28, 28)
    return torch.from_numpy((x / 255 - 0.1307) / 0.3081)

def labels(name):
    return torch.from_numpy(idx(name, 8).astype(np.int64))

x, y = images("train-images-idx3-ubyte"), labels("train-labels-idx1-ubyte")
xt, yt = images("t10k-images-idx3-ubyte"), labels("t10k-labels-idx1-ubyte")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 256), torch.nn.ReLU(),
                            torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for epoch in range(epochs):
    order = torch.randperm(len(x))
    for i in range(len(x) // 64):
        batch = order[i * 64 : (i + 1) * 64]
        optimizer.zero_grad()
        F.cross_entropy(model(x.index_select(0, batch)), y.index_select(0, batch)).backward()
        optimizer.step()
with torch.no_grad():
    print((model(xt).argmax(1) == yt).float().mean().item())
"""


def _env() -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[2] / "src")
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{path}" if path else src}


def _timed(command: list[str]) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=TIMEOUT, env=_env(), check=False
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])}... failed:\n{done.stderr[-3000:]}")
    return seconds, done.stdout


def ember_train(*args: str) -> dict[str, Any]:
    """The `ember train` command's wall time and its summary."""
    with tempfile.TemporaryDirectory(prefix="ember-startup-") as tmp:
        out = Path(tmp) / "run"
        wall, _ = _timed([sys.executable, "-m", "ember", "train", *args, "--out", str(out)])
        summary = json.loads((out / "summary.json").read_text())
    return {"wall": wall, **summary}


def run_ember(epochs: int) -> dict[str, Any]:
    s = ember_train("--epochs", str(epochs))
    return {
        "wall": s["wall"],
        "besides_training": s["wall"] - s["train_seconds"],
        "startup_seconds": s["startup_seconds"],
        "teardown_seconds": s["teardown_seconds"],
        "test_accuracy": s["test_accuracy"],
        "phases": s["phases"],
    }


def run_plain(epochs: int) -> dict[str, Any]:
    wall, out = _timed([sys.executable, "-c", PLAIN, str(MNIST_DIR), str(epochs)])
    return {"wall": wall, "test_accuracy": float(out.split()[-1])}


def _distributed_job(folder: str, epochs: int) -> float:
    """One DDP process's share of the job (TorchDistributor sets the rendezvous)."""
    import gc
    import gzip

    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    def idx(name: str, offset: int) -> np.ndarray:
        with gzip.open(f"{folder}/{name}.gz") as f:
            return np.frombuffer(f.read(), np.uint8, offset=offset)

    def images(name: str) -> torch.Tensor:
        x = idx(name, 16).astype(np.float32).reshape(-1, 1, 28, 28)
        return torch.from_numpy((x / 255 - 0.1307) / 0.3081)

    per = 60_000 // world
    x = images("train-images-idx3-ubyte")[rank * per : (rank + 1) * per]
    y = torch.from_numpy(idx("train-labels-idx1-ubyte", 8).astype(np.int64))[rank * per :][:per]
    torch.manual_seed(0)
    layers = [torch.nn.Flatten(), torch.nn.Linear(784, 256), torch.nn.ReLU()]
    layers += [torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)]
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(epochs):
        order = torch.randperm(per)
        for i in range(per // 64):
            batch = order[i * 64 : (i + 1) * 64]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x.index_select(0, batch)), y.index_select(0, batch))
            loss.backward()
            optimizer.step()
    accuracy = torch.zeros(1)
    if rank == 0:
        xt = images("t10k-images-idx3-ubyte")
        yt = torch.from_numpy(idx("t10k-labels-idx1-ubyte", 8).astype(np.int64))
        with torch.no_grad():
            accuracy[0] = (model(xt).argmax(1) == yt).float().mean()
    # Every rank returns rank 0's figure and all leave together: local mode once returned a
    # rank's placeholder when rank 0 was stopped at exit.
    dist.broadcast(accuracy, 0)
    del model, optimizer  # the reducer holds the process group; release it before its teardown
    gc.collect()
    dist.destroy_process_group()
    return float(accuracy[0])


def _distributor_child(epochs: int) -> dict[str, Any]:
    from pyspark import cloudpickle  # the serializer pyspark ships the function with
    from pyspark.ml.torch.distributor import TorchDistributor
    from pyspark.sql import SparkSession

    # this script is __mp_main__ here, which torchrun's processes cannot import: ship by value
    cloudpickle.register_pickle_by_value(sys.modules[_distributed_job.__module__])

    spark = SparkSession.builder.master("local[2]").appName("startup-bench").getOrCreate()
    try:
        started = time.perf_counter()
        distributor = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False)
        accuracy = distributor.run(_distributed_job, str(MNIST_DIR), epochs)
        return {"wall": time.perf_counter() - started, "test_accuracy": accuracy}
    finally:
        spark.stop()


def run_distributor(epochs: int) -> dict[str, Any]:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    result: dict[str, Any] = call_in_child(_distributor_child, epochs)
    return result


def peak_memory(rows: int, workers: int) -> int:
    s = ember_train(
        "--data", "synthetic-lr", "--synthetic-samples", str(rows), "--synthetic-features",
        "100", "--model", "logreg", "--strategy", "async", "--workers", str(workers),
        "--epochs", "1",
    )  # fmt: skip
    return int(s["peak_memory_bytes"])


def main() -> None:
    parser = make_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=positive_int, default=EPOCHS)
    args = parser.parse_args()
    repeat, epochs = (1, 1) if args.quick else (args.repeat, args.epochs)
    runs = {"ember": run_ember, "plain": run_plain, "distributor": run_distributor}
    repeats: list[dict[str, dict[str, Any]]] = []
    for index in range(repeat):
        order = list(runs)[index % 3 :] + list(runs)[: index % 3]
        repeats.append({name: runs[name](epochs) for name in order})
    results: dict[str, Any] = {
        name: {
            "wall": spread([r[name]["wall"] for r in repeats]),
            "test_accuracy": spread([r[name]["test_accuracy"] for r in repeats]),
        }
        for name in runs
    }
    for key in ("besides_training", "startup_seconds", "teardown_seconds"):
        results["ember"][key] = spread([r["ember"][key] for r in repeats])
    results["ember"]["phases"] = [r["ember"]["phases"] for r in repeats]
    for other in TARGETS:
        results[f"ember/{other}"] = spread([r["ember"]["wall"] / r[other]["wall"] for r in repeats])
    big = 100_000 if args.quick else 1_000_000
    memory = []
    for workers in (1, 2) if args.quick else (1, 2, 4):
        small, large = peak_memory(1_000, workers), peak_memory(big, workers)
        data = big * 100 * 4
        memory.append({"workers": workers, "small": small, "large": large, "data": data})
    results["memory"] = memory
    rows = [
        [
            name,
            fmt(results[name]["wall"]),
            fmt(results[name]["test_accuracy"], 4),
            "" if name == "ember" else f"{fmt(results[f'ember/{name}'])} (<= {TARGETS[name]})",
        ]
        for name in runs
    ]
    rows.append(
        [
            "ember besides training",
            f"{fmt(results['ember']['besides_training'])} (<= {OVERHEAD_TARGET})",
            "",
            "",
        ]
    )
    table = markdown_table(["command", "wall s", "test accuracy", "ember / it"], rows)
    mib = 1 << 20
    memory_rows = [
        [
            str(m["workers"]),
            f"{m['small'] / mib:,.0f}",
            f"{m['large'] / mib:,.0f}",
            f"{(m['large'] - m['small']) / m['data']:.2f}x",
        ]
        for m in memory
    ]
    table += f"\n\npeak memory summed over the run's processes, synthetic-lr {big:,} x 100:\n\n"
    table += markdown_table(
        ["workers", "1,000 rows MiB", f"{big:,} rows MiB", "difference / data size"],
        memory_rows,
    )
    settings = {"epochs": epochs, "repeat": repeat, "quick": args.quick, "memory_rows": big}
    report("startup", table, settings, results, args.out)


if __name__ == "__main__":
    main()
