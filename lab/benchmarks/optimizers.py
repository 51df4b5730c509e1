"""The user's optimizer on the main job, side by side: easgd-async against allreduce under
AdamW and under ember's momentum SGD, and (with --before) the main job of an earlier checkout
against this one.

    python lab/benchmarks/optimizers.py [--repeat N] [--quick] [--before SRC ...] [--out FILE]
    python lab/benchmarks/optimizers.py --at-once --before SRC [--repeat N]

Each configuration is one `ember train` process (MNIST, the main job's MLP, two workers, the
local engine); the figures are its summary's samples/s (the workers' training loops) and test
accuracy. Configurations alternate within each repeat, so the machine's drift falls on all
alike; figures are medians over the repeats and ratios are of those medians. --before SRC runs
the main job with PYTHONPATH=SRC beside this checkout's (SRC: an older checkout's src/; given
more than once, each); the ratio of each repeat's pair, whose median is printed, cancels drift
slower than one pair. --at-once (with one --before): the main job's loop alone (`single`, one
worker) of both checkouts at the same time, one core each, so that each pair meets the same
machine: on a shared machine whose speed moves by a third between runs, the only pairing that
shows a few percent.
--quick: digits, one epoch, one repeat.
"""

from __future__ import annotations

import json
import statistics
import threading
from pathlib import Path
from typing import Any

from common import ember_train, make_parser

HERE = Path(__file__).resolve().parents[2] / "src"
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


def at_once(before: Path, repeats: int, data: str, epochs: int) -> None:
    """The single-worker main job of `before` and of this checkout, started together."""
    sources, single = {"before": before, "after": HERE}, ["--strategy", "single", "--workers", "1"]
    pairs: list[dict[str, dict[str, Any]]] = []
    for repeat in range(repeats):
        found: dict[str, dict[str, Any]] = {}

        def run(name: str, into: dict[str, dict[str, Any]]) -> None:
            into[name] = train(single, sources[name], data, epochs)

        threads = [threading.Thread(target=run, args=(name, found)) for name in sources]
        for thread in threads if repeat % 2 == 0 else reversed(threads):
            thread.start()
        for thread in threads:
            thread.join()
        if len(found) < len(sources):
            raise SystemExit("a run failed; its error is above")
        pairs.append(found)
        ratio = found["after"]["samples_per_second"] / found["before"]["samples_per_second"]
        print(f"repeat {repeat + 1}: {json.dumps(found)} after/before {ratio:.3f}", flush=True)
    ratios = [p["after"]["samples_per_second"] / p["before"]["samples_per_second"] for p in pairs]
    print(
        f"after / before, run at once: median {statistics.median(ratios):.3f}"
        f" (min {min(ratios):.3f}, max {max(ratios):.3f}) over {len(ratios)} pairs"
    )


def main() -> None:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--before", type=Path, action="append", default=[], help="an older checkout's src/"
    )
    parser.add_argument("--at-once", action="store_true", help="before and after together")
    options = parser.parse_args()
    repeats = 1 if options.quick else options.repeat
    data, epochs = ("digits", 1) if options.quick else ("mnist", 5)
    if options.at_once:
        if len(options.before) != 1:
            parser.error("--at-once takes one --before")
        at_once(options.before[0], repeats, data, epochs)
        return
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
