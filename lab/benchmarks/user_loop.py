"""user_loop: samples/s of a plain PyTorch loop against the same loop under `ember.run`.

Both run `the_loop` below, in a spawned process with one torch thread: ember's MLP on `mnist`,
AdamW (lr 1e-3), batches of 64 in the built-in loop's seeded order (MemoryBatches). plain: the
optimizer itself, its rows loaded in the child. ember: `ember.run(strategy="single",
workers=1)`, the optimizer wrapped in ember.Optimizer, the rows from ctx.data. Each times its
loop alone (start-up is not the loop's), and both train on the same samples. The two alternate
within each repeat, and which goes first alternates between repeats.

--quick runs one repeat of 1 epoch of `digits` (the first 10,000 MNIST images).

Usage: python lab/benchmarks/user_loop.py [--epochs E] [--data D] [--repeat R] [--quick] [--out F]
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from common import (
    add_run_flags,
    call_in_child,
    make_parser,
    pair_table,
    repeat_side_by_side,
    report,
    run_settings,
    set_threads,
    summarize_pair,
)

EPOCHS = 2
BATCH = 64
LR = 1e-3
TARGET = 0.98  # ember / plain samples/s


def the_loop(
    model: Any, optimizer: Any, batches: Callable[[int], Iterator[Any]], epochs: int
) -> dict[str, Any]:
    """The loop both sides run: the textbook one. Returns its samples and seconds."""
    import torch.nn.functional as F

    samples, started = 0, time.perf_counter()
    for epoch in range(epochs):
        for inputs, targets in batches(epoch):
            optimizer.zero_grad()
            F.cross_entropy(model(inputs), targets).backward()
            optimizer.step()
            samples += len(targets)
    seconds = time.perf_counter() - started
    return {"samples": samples, "seconds": seconds, "samples_per_second": samples / seconds}


def scored(model: Any, x: Any, y: Any, figures: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    import torch

    with torch.no_grad():
        predicted = model(torch.from_numpy(np.asarray(x))).argmax(dim=1).numpy()
    return {**figures, "test_accuracy": float((predicted == np.asarray(y)).mean())}


def fresh(data: str) -> tuple[Any, Any, Any]:
    """The dataset, ember's MLP for it (seed 0) and AdamW over it."""
    import torch

    # a torch.optim optimizer's first step imports torch._dynamo, seconds a worker of ember's
    # fork server has paid already: paid here, before the timed loop, on both sides alike
    import torch._dynamo

    from ember.probe import build_model, load_dataset

    dataset = load_dataset(data)
    model = build_model("mlp", dataset.input_shape, dataset.num_classes, seed=0)
    return dataset, model, torch.optim.AdamW(model.parameters(), lr=LR)


def train_plain(data: str, epochs: int) -> dict[str, Any]:
    set_threads()
    from ember.probe import MemoryBatches

    dataset, model, optimizer = fresh(data)
    rows = MemoryBatches(dataset.x_train, dataset.y_train, BATCH, seed=0, rank=0)
    figures = the_loop(model, optimizer, rows.epoch, epochs)
    return scored(model, dataset.x_test, dataset.y_test, figures)


def train_under_ember(data: str, epochs: int) -> dict[str, Any]:
    """What ember.run runs on its one worker (threads=1 is the run's)."""
    import ember

    ctx = ember.context()
    _, model, optimizer = fresh(data)
    wrapped = ember.Optimizer(optimizer, model)
    figures = the_loop(model, wrapped, ctx.data.batches, epochs)
    return scored(model, ctx.data.x_test, ctx.data.y_test, figures)


def train_ember(data: str, epochs: int) -> dict[str, Any]:
    import ember

    with tempfile.TemporaryDirectory(prefix="ember-bench-") as tmp:
        return dict(
            ember.run(
                train_under_ember,
                data,
                epochs,
                data=data,
                strategy="single",
                workers=1,
                epochs=epochs,
                batch_size=BATCH,
                threads=1,
                out=str(Path(tmp) / "run"),
            )
        )


def main() -> None:
    parser = make_parser(__doc__.splitlines()[0])
    add_run_flags(parser, EPOCHS)
    args = parser.parse_args()
    epochs, repeat, data = run_settings(args)
    repeats = repeat_side_by_side(
        repeat, lambda: train_ember(data, epochs), lambda: call_in_child(train_plain, data, epochs)
    )
    settings = {
        "model": "mlp",
        "data": data,
        "epochs": epochs,
        "batch_size": BATCH,
        "optimizer": "adamw",
        "lr": LR,
        "threads": 1,
        "repeat": repeat,
        "target": TARGET,
        "quick": args.quick,
    }
    results = summarize_pair(repeats)
    table = pair_table(results, "ember.run single", TARGET)
    report("user_loop", table, settings, results, args.out)


if __name__ == "__main__":
    main()
