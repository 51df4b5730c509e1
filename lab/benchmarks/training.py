"""The training runs overhead.py and scaling.py compare: `ember.fit`, and a plain PyTorch loop.

The plain loop takes only the model factory and the dataset loader from ember, so both sides train
the same network on the same bytes with the same batch and optimizer settings (ember's defaults
for its local optimizer); the loop itself is the textbook one.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from common import set_threads

MODEL = "mlp"
BATCH = 64
LR = 0.05
MOMENTUM = 0.9
TAU = 8  # easgd's local steps between exchanges


def train_ember(
    data: str, epochs: int, strategy: str = "single", workers: int = 1
) -> dict[str, Any]:
    """One `ember.fit` run in a throw-away run directory; the figures from its summary.

    The summary's samples_per_second counts the workers' training loops, not start-up.
    """
    import ember

    with tempfile.TemporaryDirectory(prefix="ember-bench-") as tmp:
        result = ember.fit(
            strategy=strategy,
            workers=workers,
            model=MODEL,
            data=data,
            epochs=epochs,
            batch_size=BATCH,
            lr=LR,
            momentum=MOMENTUM,
            tau=TAU,
            threads=1,
            out=str(Path(tmp) / "run"),
            show_progress=False,
        )
    summary = result.summary
    return {
        key: summary[key]
        for key in ("samples", "train_seconds", "samples_per_second", "test_accuracy")
    }


def train_plain(
    data: str, epochs: int, rank: int = 0, world: int = 1, barrier: Any = None
) -> dict[str, Any]:
    """Train on rows [rank * n/world, (rank + 1) * n/world) of `data`; time the loop only.

    With a `barrier`, the timed loop starts once every process sharing it has loaded its data.
    """
    set_threads()
    import torch
    import torch.nn.functional as F

    from ember.probe import build_model, load_dataset

    dataset = load_dataset(data)
    per = len(dataset.x_train) // world
    x = torch.from_numpy(dataset.x_train[rank * per : (rank + 1) * per])
    y = torch.from_numpy(dataset.y_train[rank * per : (rank + 1) * per])
    model = build_model(MODEL, dataset.input_shape, dataset.num_classes, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    generator = torch.Generator().manual_seed(rank)
    steps_per_epoch = per // BATCH
    if barrier is not None:
        barrier.wait(timeout=300)
    started = time.perf_counter()
    for _ in range(epochs):
        order = torch.randperm(per, generator=generator)
        for step in range(steps_per_epoch):
            idx = order[step * BATCH : (step + 1) * BATCH]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
    seconds = time.perf_counter() - started
    samples = epochs * steps_per_epoch * BATCH
    return {
        "samples": samples,
        "seconds": seconds,
        "samples_per_second": samples / seconds,
        "test_accuracy": accuracy(model, dataset.x_test, dataset.y_test),
    }


def accuracy(model: Any, x: Any, y: Any) -> float:
    import torch

    with torch.no_grad():
        predicted = model(torch.from_numpy(x)).argmax(dim=1)
    return float((predicted == torch.from_numpy(y)).float().mean())
