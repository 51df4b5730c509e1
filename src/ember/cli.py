"""`ember ...`: parsing and calling only; every default and check lives in config.py."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from ember.config import FIELD_NAMES, RunConfig, make_config
from ember.errors import CheckpointError, ConfigError, EmberError, WorkerFailed

HELP = {
    "data": "mnist | digits | synthetic-lr | path to .npz, .parquet or an MNIST IDX folder",
    "model": "mlp | logreg | lenet | package.module:factory",
    "strategy": "single | bsp | ssp | async | easgd | easgd-async | allreduce",
    "engine": "local | spark",
    "resume": "auto (newest valid checkpoint in --out) or a checkpoint path",
}


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    types = {f.name: f.type for f in dataclasses.fields(RunConfig)}
    defaults = RunConfig()
    for name in FIELD_NAMES:
        flag = "--" + name.replace("_", "-")
        default = getattr(defaults, name)
        text = HELP.get(name, "")
        if "bool" in str(types[name]):
            parser.add_argument(flag, action="store_true", default=None, help=text)
            continue
        kind = _parse_type(str(types[name]))
        parser.add_argument(
            flag,
            type=kind,
            default=None,
            metavar=name.upper(),
            help=f"{text} (default: {default})".strip(),
        )


def _parse_type(annotation: str) -> Any:
    if "int" in annotation and "float" not in annotation:
        return int
    if "float" in annotation:
        return float
    return str


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "train":
            return _train(args)
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
    except KeyboardInterrupt:
        print("ember: interrupted; every process was stopped", file=sys.stderr)
        return 130


def _train(args: argparse.Namespace) -> int:
    from ember.engines import train

    overrides = {name: getattr(args, name) for name in FIELD_NAMES}
    config = make_config(overrides, args.config)
    result = train(config, show_progress=True)
    s = result.summary
    print(
        f"{s['strategy']} on {s['engine']}: test accuracy {s['test_accuracy']:.4f}, "
        f"loss {s['test_loss']:.4f}, {s['samples_per_second']:,.0f} samples/s, "
        f"{s['train_seconds']:.1f}s; run directory {result.run_dir}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
