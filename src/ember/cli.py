"""`ember ...`: parsing and calling only; every default and check lives in config.py."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import signal
import sys
from typing import Any

from ember.config import FIELD_NAMES, STRATEGIES, RunConfig, make_config
from ember.errors import CheckpointError, ConfigError, EmberError, Interrupted, WorkerFailed
from ember.flags import HELP


class _Parser(argparse.ArgumentParser):
    """Flags are never abbreviated (--epoch is not --epochs), and an unknown one is an error
    that names the nearest real flag."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def parse_known_args(  # type: ignore[override]
        self, args: Any = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(self._unrecognized(extras))
        return parsed, extras

    def _unrecognized(self, extras: list[str]) -> str:
        message = f"unrecognized arguments: {' '.join(extras)}"
        known = [flag for flag in self._option_string_actions if flag.startswith("--")]
        flags = [arg.split("=", 1)[0] for arg in extras if arg.startswith("-")]
        near = {flag: difflib.get_close_matches(flag, known, n=1) for flag in flags}
        offers = [(flag, match[0]) for flag, match in near.items() if match]
        if len(offers) == 1 and len(flags) == 1:
            return f"{message}; did you mean {offers[0][1]}?"
        if offers:
            return f"{message}; did you mean {', '.join(f'{m} for {f}' for f, m in offers)}?"
        return f"{message}; '{self.prog} --help' lists every flag"


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    types = {f.name: f.type for f in dataclasses.fields(RunConfig)}
    defaults = RunConfig()
    for name in FIELD_NAMES:
        flag = "--" + name.replace("_", "-")
        default = getattr(defaults, name)
        text = HELP.get(name, "")  # a field without a line here fails a test, not the CLI
        if "bool" in str(types[name]) and default is True:  # a switch that is on unless told
            parser.add_argument(
                flag, type=_on_off, default=None, metavar="on|off", help=f"{text} (default: on)"
            )
            continue
        if "bool" in str(types[name]):
            parser.add_argument(flag, action="store_true", default=None, help=text)
            continue
        kind = _tau if name == "tau" else _parse_type(str(types[name]))
        parser.add_argument(
            flag,
            type=kind,
            default=None,
            metavar=name.upper(),
            # an unset default is explained in the text itself
            help=text if default is None else f"{text} (default: {default})".strip(),
        )


def _on_off(text: str) -> bool:
    if text.lower() in ("on", "off"):
        return text.lower() == "on"
    raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")


def _tau(text: str) -> int | str:
    """An integer, or a policy's name that config.py checks (auto, loss)."""
    try:
        return int(text)
    except ValueError:
        return text


def _parse_type(annotation: str) -> Any:
    if "int" in annotation and "float" not in annotation:
        return int
    if "float" in annotation:
        return float
    return str


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ember",
        description="Data-parallel PyTorch training over a sharded parameter "
        "server (BSP, SSP, async, EASGD, all-reduce), locally or on Apache Spark.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train a model and write a run directory")
    train.add_argument("--config", metavar="FILE", help="YAML file of the same fields; flags win")
    _add_run_flags(train)
    evaluate = sub.add_parser("evaluate", help="score a checkpoint on a test set")
    evaluate.add_argument(
        "--checkpoint", required=True, help="a step directory or a run's checkpoints folder"
    )
    evaluate.add_argument("--data", default=None, help=HELP["data"] + " (default: as trained)")
    evaluate.add_argument(
        "--model", default=None, help="needed to import a package.module:factory model"
    )
    join = sub.add_parser(
        "join", help="add a worker to a running async, easgd-async or ssp run (elastic)"
    )
    join.add_argument("run_dir", help="the --out directory of the running `ember train`")
    join.add_argument(
        "--epochs", type=positive_int, default=1, help="passes over the data (default 1)"
    )
    _add_bench_parser(sub)
    _add_plan_parser(sub)
    return parser


def _add_bench_parser(sub: Any) -> None:
    bench = sub.add_parser(
        "bench", help="compare Spark MLlib and every strategy here; write a report and plots"
    )
    bench.add_argument(
        "--out", default="bench", help="directory for results.jsonl, report.md, PNGs"
    )
    bench.add_argument("--quick", action="store_true", help="a reduced run of everything (~3 min)")
    bench.add_argument(
        "--repeat", type=positive_int, default=1, help="runs of each row (default 1)"
    )
    bench.add_argument("--tasks", default="lr,mlp", help="of lr, mlp, lenet (default lr,mlp)")
    bench.add_argument("--strategies", default=",".join(STRATEGIES), help="ember rows to run")
    bench.add_argument("--engines", default="local", help="local and/or spark (default local)")
    bench.add_argument("--no-mllib", action="store_true", help="leave out the Spark MLlib rows")
    bench.add_argument(
        "--taus", default=None, help="easgd-async tau sweep (default 1,2,4,8,16,32; quick 1,4,32)"
    )
    bench.add_argument("--sweep-tasks", default="mlp", help="tasks to sweep tau on (default mlp)")
    bench.add_argument(
        "--workers", type=positive_int, default=2, help="workers per row (default 2)"
    )
    bench.add_argument(
        "--epochs", type=positive_int, default=None, help="epochs of every task (default its own)"
    )
    bench.add_argument("--lr-rows", type=positive_int, default=1_000_000, help="lr training rows")
    bench.add_argument("--lr-features", type=positive_int, default=100, help="lr feature columns")
    bench.add_argument(
        "--hosts", type=positive_int, default=0,
        help="also run the rows on an emulated cluster of this many worker hosts (root)",
    )  # fmt: skip
    bench.add_argument(
        "--link", default="1gbit,100mbit", help="link rates for --hosts (tc rates, or unlimited)"
    )
    bench.add_argument(
        "--compress",
        default="",
        help="compressed rows on links (bsp, async, easgd-async auto and loss), e.g. int8",
    )
    bench.add_argument("--no-torch", action="store_true", help="no TorchDistributor row on links")
    bench.add_argument("--no-local", action="store_true", help="only the rows on emulated links")


def _add_plan_parser(sub: Any) -> None:
    plan = sub.add_parser("plan", help="predict throughput per strategy and tau; recommend a tau")
    plan.add_argument("--model", default="mlp", help=HELP["model"])
    plan.add_argument("--data", default="mnist", help=HELP["data"])
    plan.add_argument("--batch-size", type=positive_int, default=64, help="per-worker minibatch")
    plan.add_argument("--workers", default="1,2,4,...,64", help="worker counts, e.g. 1,2,4,...,64")
    plan.add_argument("--taus", default="1,2,4,8,16,32", help="communication periods to consider")
    plan.add_argument(
        "--bandwidth",
        default=None,
        help="each host's link, or several to compare, e.g. 1Gbit,100Mbit (default: here)",
    )
    plan.add_argument("--latency", default="0.5ms", help="one-way latency, e.g. 0.5ms or 50us")
    plan.add_argument(
        "--compress", default="none", help="what exchanges put on the wire: none|fp16|bf16|int8"
    )


def positive_int(text: str) -> int:
    """An argparse type for counts: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _stop_on_sigterm(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        if args.command == "train":
            return _train(args)
        if args.command == "bench":
            return _bench(args)
        if args.command == "plan":
            return _plan(args)
        if args.command == "join":
            return _join(args)
        from ember.api import evaluate_checkpoint

        print(json.dumps(evaluate_checkpoint(args.checkpoint, args.data, args.model), indent=2))
        return 0
    except (ConfigError, CheckpointError) as exc:
        print(f"ember: error: {exc}", file=sys.stderr)
        return 2
    except WorkerFailed as exc:
        print(f"ember: training failed: {exc}", file=sys.stderr)
        return 1
    except EmberError as exc:
        print(f"ember: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        signum = exc.args[0] if isinstance(exc, Interrupted) else signal.SIGINT
        print(
            f"ember: interrupted by {signal.Signals(signum).name}; every process was stopped"
            " (continue a training run with --resume auto)",
            file=sys.stderr,
        )
        return 128 + signum


def _train(args: argparse.Namespace) -> int:
    from ember.api import run_config
    from ember.engines import train

    overrides = {name: getattr(args, name) for name in FIELD_NAMES}
    config = run_config(overrides, args.config)
    result = train(config, show_progress=True)
    s = result.summary
    print(
        f"{s['strategy']} on {s['engine']}: test accuracy {s['test_accuracy']:.4f}, "
        f"loss {s['test_loss']:.4f}, {s['samples_per_second']:,.0f} samples/s, "
        f"{s['train_seconds']:.1f}s; run directory {result.run_dir}"
    )
    return 0


def _bench(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ember.bench.report import write_report
    from ember.bench.runner import BenchSettings, run_bench
    from ember.perfmodel import parse_counts

    try:
        taus = parse_counts(args.taus or ("1,4,32" if args.quick else "1,2,4,8,16,32"))
    except ValueError as exc:
        raise ConfigError(f"--taus {exc}") from None
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
        torch=not args.no_torch,
        local=not args.no_local,
    )
    _require("matplotlib", "ember bench draws its plots with matplotlib", "bench")
    if settings.mllib or "spark" in settings.engines:
        _require("pyspark", "the Spark MLlib rows need pyspark (or pass --no-mllib)", "bench")
    records = run_bench(settings, log=lambda line: print(line, file=sys.stderr, flush=True))
    written = write_report(records, settings.out, settings.to_dict())
    failed = sum(r["status"] != "ok" for r in records)
    print(f"{len(records)} rows ({failed} failed); wrote {', '.join(map(str, written))}")
    return 0


def _join(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ember.engines.join import join_run

    def report(record: dict[str, Any]) -> None:
        if record.get("kind") == "start":
            print(f"joined as worker {record['rank']}", file=sys.stderr, flush=True)
        elif record.get("kind") == "worker":
            print(
                f"worker {record['rank']}: epoch {record['epoch']}, step {record['step']},"
                f" loss {record['loss']:.4f}, {record['samples_per_second']:,.0f} samples/s",
                file=sys.stderr,
                flush=True,
            )

    done = join_run(Path(args.run_dir), args.epochs, report)
    speed = done["samples"] / max(done["seconds"], 1e-9)
    print(
        f"worker {done['rank']} left the run after {done['steps']} steps ({speed:,.0f} samples/s)"
    )
    return 0


def _require(module: str, why: str, extra: str) -> None:
    """Name the missing package before a long run starts, not after it."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ConfigError(f"{why}: pip install 'ember[{extra}]'")


def _plan(args: argparse.Namespace) -> int:
    from ember.bench.calibrate import calibrate
    from ember.perfmodel import (
        Network,
        parse_bandwidths,
        parse_counts,
        parse_latency,
        wire_fraction,
    )
    from ember.plan import plan_report, scale_report
    from ember.worker import load_data

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
    config = make_config({"model": args.model, "data": args.data, "batch_size": args.batch_size})
    print(f"calibrating {config.model} on {config.data} here...", file=sys.stderr, flush=True)
    calibration = calibrate(config, load_data(config)).compressed(args.compress)
    reports = []
    for bandwidth in links:
        network = Network(bandwidth, latency if bandwidth else 0.0)
        report = plan_report(calibration, network, workers, taus)
        reports.append(
            "\n\n".join(filter(None, [report, scale_report(calibration, network, workers, taus)]))
        )
    print("\n\n".join(reports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
