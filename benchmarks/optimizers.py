"""The user's optimizer on the main job, side by side: easgd-async against allreduce under
AdamW and under ember's momentum SGD, and (with --before) the main job of an earlier checkout
against this one.

    python benchmarks/optimizers.py [--repeat N] [--quick] [--before SRC ...] [--out FILE]

Each configuration is one `ember train` process (MNIST, the main job's MLP, two workers, the
local engine); the figures are its summary's samples/s (the workers' training loops) and test
accuracy. Configurations alternate within each repeat, so the machine's drift falls on all
alike; figures are medians over the repeats and ratios are of those medians. --before SRC runs
the main job with PYTHONPATH=SRC beside this checkout's (SRC: an older checkout's src/; given
more than once, each); the ratio of each repeat's pair, whose median is printed, cancels drift
slower than one pair.
--quick: digits, one epoch, one repeat.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from common import ember_train, make_parser

HERE = Path(__file__).resolve().parents[1] / "src"
ADAMW = ["--optimizer", "adamw", "--lr", "1e-3", "--weight-decay", "0.01"]
CONFIGS = {
    "easgd-async sgd": ["--strategy", "easgd-async"],
    "allreduce sgd": ["--strategy", "allreduce"],
    "easgd-async adamw": ["--strategy", "easgd-async", *ADAMW],
    "allreduce adamw": ["--strategy", "allreduce", *ADAMW],
}
RUN_SECONDS = 900  # one training process, at most


def train(args: list[str], source: Path, data: str, epochs: int) -> dict[str, Any]:
    """One `ember train` of the main job with `args`, ember imported from `source`."""
    flags = ["--data", data, "--epochs", str(epochs), *args]
    summary = ember_train(flags, source, RUN_SECONDS)
    return {k: summary[k] for k in ("samples_per_second", "test_accuracy", "train_seconds")}


def main() -> None:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--before", type=Path, action="append", default=[], help="an older checkout's src/"
    )
    options = parser.parse_args()
    repeats = 1 if options.quick else options.repeat
    data, epochs = ("digits", 1) if options.quick else ("mnist", 5)
    runs: dict[str, list[tuple[Path, list[str]]]] = {
        name: [(HERE, args)] for name, args in CONFIGS.items()
    }
    if options.before:
        runs = {f"main job at {before}": [(before, [])] for before in options.before}
        runs["main job after"] = [(HERE, [])]
    figures: dict[str, list[dict[str, Any]]] = {name: [] for name in runs}
    for repeat in range(repeats):
        order = list(runs) if repeat % 2 == 0 else list(reversed(runs))  # alternate the order
        for name in order:
            source, args = runs[name][0]
            figures[name].append(train(args, source, data, epochs))
            print(f"repeat {repeat + 1} {name}: {figures[name][-1]}", flush=True)
    medians = {
        name: {
            key: statistics.median(run[key] for run in found)
            for key in ("samples_per_second", "test_accuracy")
        }
        for name, found in figures.items()
    }
    print(json.dumps(medians, indent=1))
    ratios = {}
    for first, second in (("easgd-async", "allreduce"),):
        for optimizer in ("sgd", "adamw"):
            a, b = medians.get(f"{first} {optimizer}"), medians.get(f"{second} {optimizer}")
            if a and b:
                ratios[f"{first}/{second} {optimizer}"] = (
                    a["samples_per_second"] / b["samples_per_second"]
                )
    for name in (name for name in medians if name.startswith("main job at ")):
        after, before = medians["main job after"], medians[name]
        ratios[f"after / {name}"] = after["samples_per_second"] / before["samples_per_second"]
        ratios[f"median pair ratio, after / {name}"] = statistics.median(
            a["samples_per_second"] / b["samples_per_second"]
            for a, b in zip(figures["main job after"], figures[name], strict=True)
        )
    print("ratios of median samples/s:", json.dumps(ratios, indent=1))
    if options.out is not None:
        options.out.write_text(json.dumps({"runs": figures, "medians": medians, **ratios}))


if __name__ == "__main__":
    main()
