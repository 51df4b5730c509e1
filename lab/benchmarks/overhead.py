"""overhead: samples/s of ember's single-worker loop against a plain PyTorch loop.

ember: `ember.fit(strategy="single", workers=1, model="mlp", data="mnist", batch_size=64,
threads=1)`, whose summary's samples_per_second counts its worker's training loop only.
plain: the same model, data, batch and optimizer (SGD lr 0.05, momentum 0.9) in a spawned
process, shuffled index batches `x[idx]`, timed over the same number of samples (loop only).
The two alternate within each repeat, and which goes first alternates between repeats.

--quick runs one repeat of 1 epoch of `digits` (the first 10,000 MNIST images).

Usage: python lab/benchmarks/overhead.py [--epochs E] [--data D] [--repeat R] [--quick] [--out F]
"""

from __future__ import annotations

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
from training import BATCH, LR, MODEL, MOMENTUM, train_ember, train_plain

EPOCHS = 2
TARGET = 0.95  # ember / plain samples/s


def main() -> None:
    parser = make_parser(__doc__.splitlines()[0])
    add_run_flags(parser, EPOCHS)
    args = parser.parse_args()
    set_threads()
    epochs, repeat, data = run_settings(args)
    repeats = repeat_side_by_side(
        repeat, lambda: train_ember(data, epochs), lambda: call_in_child(train_plain, data, epochs)
    )
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
    results = summarize_pair(repeats)
    report("overhead", pair_table(results, "ember single", TARGET), settings, results, args.out)


if __name__ == "__main__":
    main()
