"""overhead: samples/s of ember's single-worker loop against a plain PyTorch loop.

ember: `ember.fit(strategy="single", workers=1, model="mlp", data="mnist", batch_size=64,
threads=1)`, whose summary's samples_per_second counts its worker's training loop only.
plain: the same model, data, batch and optimizer (SGD lr 0.05, momentum 0.9) in a spawned
process, shuffled index batches `x[idx]`, timed over the same number of samples (loop only).
The two alternate within each repeat, and which goes first alternates between repeats.

--quick runs one repeat of 1 epoch of `digits` (the first 10,000 MNIST images).

Usage: python benchmarks/overhead.py [--epochs E] [--data D] [--repeat R] [--quick] [--out F]
"""

from __future__ import annotations

from typing import Any

from common import (
    call_in_child,
    check,
    fmt,
    make_parser,
    markdown_table,
    positive_int,
    report,
    set_threads,
    spread,
)
from training import BATCH, LR, MODEL, MOMENTUM, train_ember, train_plain

EPOCHS = 2
TARGET = 0.95  # ember / plain samples/s


def one_repeat(index: int, data: str, epochs: int) -> dict[str, dict[str, Any]]:
    """An ember run and a plain run back to back; odd repeats start with the plain one."""
    runs = {
        "ember": lambda: train_ember(data, epochs),
        "plain": lambda: call_in_child(train_plain, data, epochs),
    }
    order = ["ember", "plain"] if index % 2 == 0 else ["plain", "ember"]
    figures = {name: runs[name]() for name in order}
    if figures["ember"]["samples"] != figures["plain"]["samples"]:
        raise RuntimeError(
            f"ember trained {figures['ember']['samples']} samples, the plain loop "
            f"{figures['plain']['samples']}: the runs are not comparable"
        )
    return figures


def summarize(repeats: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    results: dict[str, Any] = {
        name: {
            key: spread([r[name][key] for r in repeats])
            for key in ("samples_per_second", "test_accuracy")
        }
        for name in ("ember", "plain")
    }
    ratios = [r["ember"]["samples_per_second"] / r["plain"]["samples_per_second"] for r in repeats]
    results["ratio"] = spread(ratios)
    results["repeats"] = repeats
    return results


def table(results: dict[str, Any]) -> str:
    ember, plain, ratio = results["ember"], results["plain"], results["ratio"]
    rows = [
        [
            "samples/s",
            fmt(ember["samples_per_second"], 0),
            fmt(plain["samples_per_second"], 0),
            fmt(ratio, 3),
            check(ratio, TARGET),
        ],
        ["test accuracy", fmt(ember["test_accuracy"], 4), fmt(plain["test_accuracy"], 4), "", ""],
    ]
    return markdown_table(
        ["figure", "ember single", "plain PyTorch", "ember / plain", f">= {TARGET}"], rows
    )


def main() -> None:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--epochs",
        type=positive_int,
        default=EPOCHS,
        help=f"epochs per run (default {EPOCHS}; 1 with --quick)",
    )
    parser.add_argument(
        "--data", default=None, help="dataset name (default mnist; digits with --quick)"
    )
    args = parser.parse_args()
    set_threads()
    epochs, repeat = (1, 1) if args.quick else (args.epochs, args.repeat)
    data = args.data or ("digits" if args.quick else "mnist")
    repeats = []
    for index in range(repeat):
        repeats.append(one_repeat(index, data, epochs))
        done = repeats[-1]
        print(
            f"repeat {index + 1}/{repeat}: ember {done['ember']['samples_per_second']:,.0f}, "
            f"plain {done['plain']['samples_per_second']:,.0f} samples/s",
            flush=True,
        )
    print()
    settings = {
        "model": MODEL,
        "data": data,
        "epochs": epochs,
        "batch_size": BATCH,
        "lr": LR,
        "momentum": MOMENTUM,
        "threads": 1,
        "repeat": repeat,
        "target": TARGET,
        "quick": args.quick,
    }
    results = summarize(repeats)
    report("overhead", table(results), settings, results, args.out)


if __name__ == "__main__":
    main()
