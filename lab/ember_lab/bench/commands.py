"""The measuring commands, `ember bench` and `ember plan`: their flags and what they call.
ember's cli finds add_bench_parser and add_plan_parser through the "ember.commands" entry points
(lab/pyproject.toml); each sets the handler the cli calls with the parsed arguments."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ember.config import DILOCO_TAU, STRATEGIES, make_config
from ember.errors import ConfigError
from ember.probe import HELP, positive_int


def add_bench_parser(sub: Any) -> None:
    """`ember bench`'s flags, on the subcommands of cli.py's parser."""
    parser = sub.add_parser(
        "bench", help="compare Spark MLlib and every strategy here; write a report and plots"
    )
    parser.add_argument(
        "--out", default="bench", help="directory for results.jsonl, report.md, PNGs"
    )
    parser.add_argument("--quick", action="store_true", help="a reduced run of everything (~3 min)")
    parser.add_argument(
        "--repeat", type=positive_int, default=1, help="runs of each row (default 1)"
    )
    parser.add_argument("--tasks", default="lr,mlp", help="of lr, mlp, lenet, cnn (default lr,mlp)")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="ember rows to run")
    parser.add_argument("--engines", default="local", help="local and/or spark (default local)")
    parser.add_argument("--no-mllib", action="store_true", help="leave out the Spark MLlib rows")
    parser.add_argument(
        "--taus",
        default=None,
        help="easgd-async tau sweep (default 1,2,4,8,16,32; quick 1,4,32; none: no sweep)",
    )
    parser.add_argument("--sweep-tasks", default="mlp", help="tasks to sweep tau on (default mlp)")
    parser.add_argument(
        "--workers", type=positive_int, default=2, help="workers per row (default 2)"
    )
    parser.add_argument(
        "--epochs",
        type=_count_per_task,
        default=None,
        help="epochs of every task, or of some, e.g. mlp=3,cnn=1 (default each task's own)",
    )
    parser.add_argument("--lr-rows", type=positive_int, default=1_000_000, help="lr training rows")
    parser.add_argument("--lr-features", type=positive_int, default=100, help="lr feature columns")
    parser.add_argument(
        "--hosts", type=positive_int, default=0,
        help="also run the rows on an emulated cluster of this many worker hosts (root)",
    )  # fmt: skip
    parser.add_argument(
        "--link", default="1gbit,100mbit", help="link rates for --hosts (tc rates, or unlimited)"
    )
    parser.add_argument(
        "--compress",
        default="",
        help="compressed rows on links (bsp, async, easgd-async auto and loss), e.g. int8",
    )
    parser.add_argument(
        "--tau-policies",
        default="auto,loss",
        help="easgd-async's adaptive rows on links, of auto and loss (none: neither)",
    )
    parser.add_argument(
        "--diloco-tau",
        type=_count_per_task,
        default=DILOCO_TAU,
        help=f"diloco's period, or some tasks', e.g. mlp=234,cnn=116 (default {DILOCO_TAU})",
    )
    parser.add_argument(
        "--fragments",
        default="",
        help="a diloco row synced in each of these fragment counts, e.g. 2 (servers = count)",
    )
    parser.add_argument(
        "--outer",
        default="",
        help="a whole-model diloco row at each of these outer steps, LR/MOMENTUM, e.g. 1/0",
    )
    parser.add_argument("--no-torch", action="store_true", help="no TorchDistributor row on links")
    parser.add_argument("--no-local", action="store_true", help="only the rows on emulated links")
    parser.set_defaults(handler=bench)


def bench(args: argparse.Namespace) -> int:
    """`ember bench`: run the rows, write the report and plots."""
    from pathlib import Path

    from ember_lab.bench.report import write_report
    from ember_lab.bench.runner import BenchSettings, run_bench

    try:
        taus = _counts(args.taus or ("1,4,32" if args.quick else "1,2,4,8,16,32"))
    except ValueError as exc:
        raise ConfigError(f"--taus {exc}") from None
    try:
        fragments = _counts(args.fragments or "none")
    except ValueError as exc:
        raise ConfigError(f"--fragments {exc}") from None
    settings = BenchSettings(
        out=Path(args.out),
        quick=args.quick,
        repeat=args.repeat,
        tasks=_names(args.tasks),
        strategies=_names(args.strategies),
        engines=_names(args.engines),
        mllib=not args.no_mllib,
        taus=taus,
        sweep_tasks=_names(args.sweep_tasks),
        workers=args.workers,
        lr_rows=args.lr_rows,
        lr_features=args.lr_features,
        epochs=args.epochs,
        hosts=args.hosts,
        links=_names(args.link),
        compress=_names(args.compress),
        tau_policies=[p for p in _names(args.tau_policies) if p != "none"],
        diloco_tau=args.diloco_tau,
        fragments=fragments,
        outer=_outer_steps(args.outer),
        torch=not args.no_torch,
        local=not args.no_local,
    )
    _require("matplotlib", "ember bench draws its plots with matplotlib")
    if settings.mllib or "spark" in settings.engines:
        _require("pyspark", "the Spark MLlib rows need pyspark (or pass --no-mllib)")
    records = run_bench(settings, log=lambda line: print(line, file=sys.stderr, flush=True))
    written = write_report(records, settings.out, settings.to_dict())
    failed = sum(r["status"] != "ok" for r in records)
    print(f"{len(records)} rows ({failed} failed); wrote {', '.join(map(str, written))}")
    return 0


def _require(module: str, why: str) -> None:
    """Name the missing package before a long run starts, not after it."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ConfigError(f"{why}: pip install {module}")


def add_plan_parser(sub: Any) -> None:
    """`ember plan`'s flags, on the subcommands of cli.py's parser."""
    parser = sub.add_parser("plan", help="predict throughput per strategy and tau; recommend a tau")
    parser.add_argument("--model", default="mlp", help=HELP["model"])
    parser.add_argument("--data", default="mnist", help=HELP["data"])
    parser.add_argument("--batch-size", type=positive_int, default=64, help="per-worker minibatch")
    parser.add_argument(
        "--workers", default="1,2,4,...,64", help="worker counts, e.g. 1,2,4,...,64"
    )
    parser.add_argument("--taus", default="1,2,4,8,16,32", help="communication periods to consider")
    parser.add_argument(
        "--bandwidth",
        default=None,
        help="each host's link, or several to compare, e.g. 1Gbit,100Mbit (default: here)",
    )
    parser.add_argument("--latency", default="0.5ms", help="one-way latency, e.g. 0.5ms or 50us")
    parser.add_argument(
        "--compress", default="none", help="what exchanges put on the wire: none|fp16|bf16|int8"
    )
    parser.add_argument("--device", default="auto", help=HELP["device"])
    parser.add_argument("--precision", default="32", help=HELP["precision"])
    parser.add_argument(
        "--encrypt",
        choices=("on", "off"),
        default="on",
        help="whether the runs across hosts encrypt their wire, as they do by default: on adds"
        " what sealing and opening the payloads cost, measured here",
    )
    parser.add_argument(
        "--wire-cipher", choices=("curve", "aead"), default="curve", help=HELP["wire_cipher"]
    )
    parser.set_defaults(handler=plan)


def plan(args: argparse.Namespace) -> int:
    """`ember plan`: calibrate here, then predict per link rate and worker count."""
    from ember.probe import load_data
    from ember_lab.bench.calibrate import calibrate
    from ember_lab.bench.cipher_probe import cipher_cpu_per_byte
    from ember_lab.perfmodel import (
        Network,
        parse_bandwidths,
        parse_counts,
        parse_latency,
        wire_fraction,
    )
    from ember_lab.plan import plan_report, scale_report

    try:
        workers, taus = parse_counts(args.workers), parse_counts(args.taus)
        latency = parse_latency(args.latency)
        links = parse_bandwidths(args.bandwidth) if args.bandwidth else [None]
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    try:
        wire_fraction(args.compress)
    except ValueError as exc:
        raise ConfigError(f"--{exc}") from None
    fields = ("model", "data", "batch_size", "device", "precision")
    config = make_config({name: getattr(args, name) for name in fields})
    where = f"here ({config.device}, precision {config.precision})"
    print(f"calibrating {config.model} on {config.data} {where}...", file=sys.stderr, flush=True)
    calibration = calibrate(config, load_data(config)).compressed(args.compress)
    across = calibration
    if args.encrypt == "on" and any(links):
        across = calibration.encrypted(cipher_cpu_per_byte(config, args.wire_cipher))
    reports = []
    for bandwidth in links:
        network = Network(bandwidth, latency if bandwidth else 0.0)
        linked = across if bandwidth else calibration  # payloads cross the wire encrypted
        report = plan_report(linked, network, workers, taus)
        if bandwidth:
            report = _wire_line(args, calibration, across) + "\n" + report
        reports.append(
            "\n\n".join(filter(None, [report, scale_report(linked, network, workers, taus)]))
        )
    print("\n\n".join(reports))
    return 0


def _wire_line(args: argparse.Namespace, plain: Any, encrypted: Any) -> str:
    """What `ember plan` took the wire across hosts to cost beyond the link."""
    if args.encrypt == "off":
        return "wire across hosts: plaintext (--encrypt off)"
    added = (encrypted.client_cpu - plain.client_cpu) * 1e3
    return (
        f"wire across hosts: encrypted with {args.wire_cipher} (--encrypt off for plaintext):"
        f" sealing and opening an exchange's payloads adds {added:.2f} ms of CPU at each end,"
        " measured here"
    )


def _count_per_task(text: str) -> int | dict[str, int]:
    """--epochs, --diloco-tau: a count for every task, or task=count pairs."""
    if "=" not in text:
        return positive_int(text)
    pairs = [part.partition("=") for part in _names(text)]
    return {name.strip(): positive_int(count) for name, _, count in pairs}


def _counts(text: str) -> list[int]:
    """parse_counts, and "none" for no count at all."""
    from ember_lab.perfmodel import parse_counts

    return [] if text.strip() == "none" else parse_counts(text)


def _outer_steps(text: str) -> list[tuple[float, float]]:
    """--outer: LR/MOMENTUM pairs, e.g. "1/0,0.7/0.6"."""
    steps = []
    for part in _names(text):
        lr, _, momentum = part.partition("/")  # no slash: float("") refuses it
        try:
            steps.append((float(lr), float(momentum)))
        except ValueError:
            raise ConfigError(
                f"--outer {part!r}: expected LR/MOMENTUM, e.g. 1/0 or 0.7/0.9"
            ) from None
    return steps


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]
