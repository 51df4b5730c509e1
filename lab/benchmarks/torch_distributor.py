"""torch_distributor: one DDP loop under TorchDistributor.run and under ember.run, side by side.

The loop is TorchDistributor's own end-to-end training function (apache/spark
python/pyspark/ml/torch/tests/test_distributor.py, `create_training_function`; in this repository
tests/peers/mnist_ddp.py): a gloo process group, a DistributedSampler over MNIST (the copy ember
ships, uint8 images turned into tensors item by item with ToTensor and Normalize's arithmetic),
batches of 100, the small CNN under DistributedDataParallel, SGD with momentum 0.5, lr 1e-3.
Two changes, both so that it can be measured: it forwards through the DDP module (the peer's
calls the bare module, so DDP all-reduces nothing), and it times itself: one torch thread,
torch._dynamo imported (a torch.optim optimizer's first step imports it), a barrier, then the
clock over its epochs. Every rank returns the same figures, the samples all ranks trained, rank
0's seconds and the last epoch's mean loss, so which rank's value a launcher returns does not
matter (under local_mode=True each rank writes the one output file, and the last one wins).

Two pairs, in one local[2] SparkSession, each launch timed in this process from the call of the
launcher line to its return (TorchDistributor's construction included):
- **Spark**: `TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(fn, lr)`, a
  barrier stage whose 2 tasks each run torchrun with one process, against `ember.run(fn, lr,
  strategy="allreduce", workers=2, engine="spark")` in the same session.
- **local**: `TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(fn, lr)`,
  torchrun with 2 processes on the driver (it needs an active SparkSession all the same),
  against `ember.run(fn, lr, strategy="allreduce", workers=2)` on ember's local engine.

Within each repeat the two sides of a pair run back to back, the order alternating between
repeats; the ratios (ember / TorchDistributor) are computed per repeat, then summarized as
median (min–max). One untimed launch of each of the four comes first, on 1/10 of the rows, so
that no timed launch pays the session's first Python workers.

--quick trains one epoch of the first 4,000 rows once, without the untimed launches. With
--out F.json the figures go to F.json and a Markdown page to F.md beside it, with the command.

Usage: python lab/benchmarks/torch_distributor.py [--rows N] [--epochs E] [--repeat R] [--quick]
                                                  [--out F.json]
"""

from __future__ import annotations

import contextlib
import gzip
import io
import logging
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from common import fmt, make_parser, markdown_table, positive_int, report, spread
from ember.probe import MNIST_DIR, end_spark

ROWS, QUICK_ROWS = 60_000, 4_000  # MNIST's training rows; --quick's
EPOCHS = 1  # as the peer's function
BATCH, MOMENTUM, LR = 100, 0.5, 1e-3  # the peer's batch and momentum; its tests' lr
MASTER = "local[2]"
PAIRS = ("spark", "local")
SIDES = ("distributor", "ember")
FIGURES = ("wall", "samples_per_second", "seconds", "loss")
TITLE = "# The same DDP loop under TorchDistributor.run and ember.run"


class MNIST(torch.utils.data.Dataset):
    """torchvision's MNIST(train=True) with ToTensor and Normalize((0.1307,), (0.3081,)): uint8
    images kept, each item scaled when read, as tests/peers/mnist_ddp.py has it."""

    def __init__(self, rows: int) -> None:
        def read(name: str, header: int) -> np.ndarray:
            with gzip.open(Path(MNIST_DIR) / name) as file:
                return np.frombuffer(file.read(), np.uint8, offset=header)

        self.images = read("train-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28)[:rows].copy()
        self.labels = read("train-labels-idx1-ubyte.gz", 8)[:rows].astype(np.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = torch.from_numpy(self.images[index]).float().div(255).unsqueeze(0)
        return (image - 0.1307) / 0.3081, int(self.labels[index])


class Net(nn.Module):
    """The peer's CNN."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x: Any) -> Any:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = F.relu(self.fc1(x.view(-1, 320)))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def training_function(rows: int, epochs: int) -> Callable[[float], dict[str, Any]]:
    """The peer's closure over its training set, timing its own loop."""
    train_dataset = MNIST(rows)

    def train_fn(learning_rate: float) -> dict[str, Any]:
        import torch
        import torch._dynamo  # paid here, not in the timed loop's first step
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.utils.data.distributed import DistributedSampler

        torch.set_num_threads(1)
        dist.init_process_group("gloo")
        sampler = DistributedSampler(dataset=train_dataset)
        loader = torch.utils.data.DataLoader(train_dataset, batch_size=BATCH, sampler=sampler)
        model = Net()
        ddp_model = DDP(model)
        optimizer = torch.optim.SGD(ddp_model.parameters(), lr=learning_rate, momentum=MOMENTUM)
        samples, loss_sum, loss_rows = 0, 0.0, 0
        dist.barrier()
        started = time.perf_counter()
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            model.train()
            loss_sum, loss_rows = 0.0, 0  # the last epoch's
            for data, target in loader:
                optimizer.zero_grad()
                loss = F.nll_loss(ddp_model(data), target)
                loss.backward()
                optimizer.step()
                samples += len(target)
                loss_sum, loss_rows = loss_sum + loss.item() * len(target), loss_rows + len(target)
        seconds = time.perf_counter() - started if dist.get_rank() == 0 else 0.0
        totals = torch.tensor([samples, loss_sum, loss_rows, seconds], dtype=torch.float64)
        dist.all_reduce(totals)  # all ranks' samples and losses, rank 0's seconds
        # No destroy_process_group, as in the peer's: freeing the group right after a
        # collective can deadlock in gloo's destructor (torch 2.13), and ember.run's worker
        # defers its own call for that (ember.algorithms.allreduce.settled); TorchDistributor's
        # torchrun workers exit.
        return {
            "samples": int(totals[0]),
            "seconds": float(totals[3]),
            "loss": float(totals[1] / totals[2]),
        }

    return train_fn


def launch(pair: str, side: str, fn: Callable[[float], Any]) -> dict[str, Any]:
    """One launcher line, timed from its call to its return; the loop's figures."""
    from pyspark.ml.torch.distributor import TorchDistributor

    import ember

    # TorchDistributor echoes torchrun's output (its warnings) to stdout: kept off the report
    quiet = contextlib.redirect_stdout(io.StringIO())
    with tempfile.TemporaryDirectory(prefix="ember-bench-td-") as tmp, quiet:
        started = time.perf_counter()
        if side == "distributor":
            local_mode = pair == "local"
            value = TorchDistributor(2, local_mode=local_mode, use_gpu=False).run(fn, LR)
        else:
            run = f"{tmp}/run"
            value = ember.run(fn, LR, strategy="allreduce", workers=2, engine=pair, out=run)
        wall = time.perf_counter() - started
    return {**value, "wall": wall, "samples_per_second": value["samples"] / value["seconds"]}


def one_repeat(index: int, fn: Callable[[float], Any]) -> dict[str, Any]:
    done: dict[str, Any] = {}
    for pair in PAIRS:
        order = SIDES if index % 2 == 0 else SIDES[::-1]
        done[pair] = {side: launch(pair, side, fn) for side in order}
        if len({done[pair][side]["samples"] for side in SIDES}) != 1:
            raise RuntimeError(f"{pair}: the two sides trained different samples: {done[pair]}")
    return done


def summarize(repeats: list[dict[str, Any]]) -> dict[str, Any]:
    results: dict[str, Any] = {"repeats": repeats}
    for pair in PAIRS:
        runs = [r[pair] for r in repeats]
        results[pair] = {
            side: {key: spread([r[side][key] for r in runs]) for key in FIGURES} for side in SIDES
        }
        for key in ("wall", "samples_per_second"):
            ratios = [r["ember"][key] / r["distributor"][key] for r in runs]
            results[pair][f"{key}_ratio"] = spread(ratios)
    return results


def table(results: dict[str, Any]) -> str:
    rows = []
    for pair, where in (("spark", f"Spark {MASTER}"), ("local", "local")):
        figures = results[pair]
        for key, label, digits in (
            ("wall", "wall seconds, launcher call to return", 2),
            ("samples_per_second", "samples/s of the timed loop", 0),
            ("loss", "training loss, last epoch", 4),
        ):
            ratio = figures.get(f"{key}_ratio")
            rows.append(
                [f"{where}: {label}"]
                + [fmt(figures[side][key], digits) for side in SIDES]
                + [fmt(ratio, 3) if ratio else ""]
            )
    return markdown_table(
        ["run", "TorchDistributor", "ember.run", "ember / TorchDistributor"], rows
    )


def start_session() -> Any:
    """The local[2] session both pairs run in (TorchDistributor needs one for local_mode=True
    too), with TorchDistributor's INFO lines (training started, finished) kept off."""
    logger = logging.getLogger("TorchDistributor")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(MASTER).config("spark.driver.memory", "4g")
    builder = builder.config("spark.ui.enabled", "false")
    spark = builder.config("spark.ui.showConsoleProgress", "false").getOrCreate()
    spark.sparkContext.setLogLevel("FATAL")
    return spark


def main() -> None:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--rows", type=positive_int, default=ROWS, help=f"default {ROWS}")
    parser.add_argument("--epochs", type=positive_int, default=EPOCHS, help=f"default {EPOCHS}")
    args = parser.parse_args()
    rows, epochs, repeat = (
        (QUICK_ROWS, 1, 1) if args.quick else (args.rows, args.epochs, args.repeat)
    )
    command = shlex.join(["python", "lab/benchmarks/torch_distributor.py", *sys.argv[1:]])
    fn = training_function(rows, epochs)
    spark = start_session()
    try:
        if not args.quick:  # the session's first Python workers, paid by no timed launch
            small = training_function(max(rows // 10, 2 * BATCH), 1)
            for pair in PAIRS:
                for side in SIDES:
                    launch(pair, side, small)
        repeats = []
        for index in range(repeat):
            repeats.append(one_repeat(index, fn))
            walls = [f"{p} {s} {repeats[-1][p][s]['wall']:.2f} s" for p in PAIRS for s in SIDES]
            print(f"repeat {index + 1}/{repeat}: {', '.join(walls)}", flush=True)
    finally:
        end_spark(spark)
    print()
    settings = {"rows": rows, "epochs": epochs, "batch_size": BATCH, "momentum": MOMENTUM}
    settings |= {"lr": LR, "master": MASTER, "workers": 2, "threads": 1, "repeat": repeat}
    settings |= {"quick": args.quick, "command": command}
    results = summarize(repeats)
    text = table(results)
    report("torch_distributor", text, settings, results, args.out)
    if args.out is not None:  # the page beside the JSON
        page = args.out.with_suffix(".md")
        what = "[what each figure is](../../lab/benchmarks/README.md#torch_distributorpy)"
        page.write_text(f"{TITLE}\n\n`{command}` ({what}):\n\n{text}\n")
        print(f"wrote {page}")


if __name__ == "__main__":
    main()
