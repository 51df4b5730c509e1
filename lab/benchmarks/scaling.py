"""scaling: two ember workers x one thread on two cores against two independent plain loops.

ceiling: two plain PyTorch processes (training.py) started at once, each training ember's mlp
on one half of the data with batch 64; the ceiling is the sum of their samples/s. Then
`ember.fit(workers=2, strategy=S, batch_size=64, threads=1, ...)` for every strategy S (easgd
variants with tau 8), reporting samples/s, the ratio to the ceiling and the test accuracy.
Each repeat runs the strategies back to back, starting from a different one each time, with a
ceiling run before the first and after each: a strategy's ratio is to the mean of the two
ceilings around it.

--quick runs one repeat of 1 epoch of `digits`, and only easgd-async and allreduce (the two the
targets compare).

Usage: python lab/benchmarks/scaling.py [--epochs E] [--data D] [--repeat R] [--quick] [--out F]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from common import (
    SPAWN,
    add_run_flags,
    call_in_children,
    check,
    fmt,
    make_parser,
    markdown_table,
    report,
    run_settings,
    set_threads,
    spread,
)
from training import BATCH, MODEL, TAU, train_ember, train_plain

EPOCHS = 2
WORKERS = 2
STRATEGIES = ("easgd-async", "allreduce", "bsp", "ssp", "async", "easgd")
QUICK_STRATEGIES = ("easgd-async", "allreduce")  # the two the targets compare
CEILING = "ceiling"
TARGET_VS_CEILING = 0.85  # easgd-async samples/s / ceiling
TARGET_VS_ALLREDUCE = 1.5  # easgd-async samples/s / allreduce samples/s

Repeat = dict[str, dict[str, Any]]


def measure_ceiling(data: str, epochs: int) -> dict[str, Any]:
    """Two plain loops, one per half of the data, whose timed loops start together."""
    barrier = SPAWN.Barrier(WORKERS)
    calls = [(train_plain, (data, epochs, rank, WORKERS, barrier)) for rank in range(WORKERS)]
    runs = call_in_children(calls)
    return {
        "samples_per_second": sum(r["samples_per_second"] for r in runs),
        "test_accuracy": runs[0]["test_accuracy"],
        "processes": runs,
    }


def one_repeat(index: int, data: str, epochs: int, strategies: tuple[str, ...]) -> Repeat:
    """Every strategy once, each between two ceiling runs: its ratio is to the mean of the
    ceilings measured just before and just after it, so a drift in the machine's speed during
    the repeat moves both sides of the ratio alike."""
    order = strategies[index % len(strategies) :] + strategies[: index % len(strategies)]
    figures: Repeat = {}
    ceilings = [measure_ceiling(data, epochs)]
    for name in order:
        figures[name] = train_ember(data, epochs, strategy=name, workers=WORKERS)
        ceilings.append(measure_ceiling(data, epochs))
        around = [c["samples_per_second"] for c in ceilings[-2:]]
        figures[name]["ceiling_samples_per_second"] = sum(around) / 2
        print(
            f"  {name}: {figures[name]['samples_per_second']:,.0f} samples/s,"
            f" ceiling around it {around[0]:,.0f} / {around[1]:,.0f}",
            flush=True,
        )
    figures[CEILING] = {
        "samples_per_second": sum(c["samples_per_second"] for c in ceilings) / len(ceilings),
        "test_accuracy": ceilings[0]["test_accuracy"],
        "runs": ceilings,
    }
    return figures


def summarize(repeats: list[Repeat], strategies: tuple[str, ...]) -> dict[str, Any]:
    def over_repeats(figure: Callable[[Repeat], float]) -> dict[str, Any]:
        return spread([figure(r) for r in repeats])

    def speed(r: Repeat, name: str) -> float:
        return float(r[name]["samples_per_second"])

    def vs_ceiling(r: Repeat, name: str) -> float:
        return 1.0 if name == CEILING else speed(r, name) / r[name]["ceiling_samples_per_second"]

    results: dict[str, Any] = {
        name: {
            "samples_per_second": over_repeats(lambda r, n=name: speed(r, n)),
            "vs_ceiling": over_repeats(lambda r, n=name: vs_ceiling(r, n)),
            "test_accuracy": over_repeats(lambda r, n=name: r[n]["test_accuracy"]),
        }
        for name in (CEILING, *strategies)
    }
    results["easgd_async_vs_allreduce"] = over_repeats(
        lambda r: speed(r, "easgd-async") / speed(r, "allreduce")
    )
    results["repeats"] = repeats
    return results


def table(results: dict[str, Any], strategies: tuple[str, ...]) -> str:
    rows = []
    for name in (CEILING, *strategies):
        figures = results[name]
        label = "ceiling: 2 x plain PyTorch" if name == CEILING else f"ember {name}"
        accuracy = fmt(figures["test_accuracy"], 4)
        rows.append(
            [
                label,
                fmt(figures["samples_per_second"], 0),
                fmt(figures["vs_ceiling"], 3),
                f"{accuracy} (rank 0)" if name == CEILING else accuracy,
            ]
        )
    vs_ceiling = results["easgd-async"]["vs_ceiling"]
    vs_allreduce = results["easgd_async_vs_allreduce"]
    targets = [
        [
            f"easgd-async / ceiling >= {TARGET_VS_CEILING}",
            fmt(vs_ceiling, 3),
            check(vs_ceiling, TARGET_VS_CEILING),
        ],
        [
            f"easgd-async / allreduce >= {TARGET_VS_ALLREDUCE}",
            fmt(vs_allreduce, 3),
            check(vs_allreduce, TARGET_VS_ALLREDUCE),
        ],
    ]
    return "\n\n".join(
        [
            markdown_table(["run", "samples/s", "/ ceiling", "test accuracy"], rows),
            markdown_table(["target", "measured", "met"], targets),
        ]
    )


def main() -> None:
    parser = make_parser(__doc__.splitlines()[0])
    add_run_flags(parser, EPOCHS, ", each worker over its half")
    args = parser.parse_args()
    set_threads()
    epochs, repeat, data = run_settings(args)
    strategies = QUICK_STRATEGIES if args.quick else STRATEGIES
    repeats = []
    for index in range(repeat):
        print(f"repeat {index + 1}/{repeat}", flush=True)
        repeats.append(one_repeat(index, data, epochs, strategies))
    print()
    settings = {
        "model": MODEL,
        "data": data,
        "epochs": epochs,
        "workers": WORKERS,
        "threads": 1,
        "batch_size": BATCH,
        "tau": TAU,
        "strategies": list(strategies),
        "repeat": repeat,
        "quick": args.quick,
        "targets": {
            "easgd_async_vs_ceiling": TARGET_VS_CEILING,
            "easgd_async_vs_allreduce": TARGET_VS_ALLREDUCE,
        },
    }
    results = summarize(repeats, strategies)
    report("scaling", table(results, strategies), settings, results, args.out)


if __name__ == "__main__":
    main()
