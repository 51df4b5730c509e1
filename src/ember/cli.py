"""`ember ...`: parsing and calling only; every default and check lives in config/. The lab's
commands (`ember bench`, `ember plan`) come from the "ember.commands" entry points it installs.

imports: api, config, data, engines, errors, metrics, predictions
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
from importlib.metadata import entry_points
from typing import Any

from ember.config import FIELD_NAMES, RunConfig, did_you_mean
from ember.config.flags import HELP, positive_int
from ember.errors import CheckpointError, ConfigError, EmberError, Interrupted, WorkerFailed
from ember.metrics import headline, json_text


class _Parser(argparse.ArgumentParser):
    """Flags are never abbreviated (--epoch is not --epochs), and an unknown one is an error
    that names the nearest real flag."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def parse_known_args(  # type: ignore[override]
        self, args: Any = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and getattr(parsed, "handler", None) is not _lab_missing:
            self.error(self._unrecognized(extras))
        return parsed, extras

    def _unrecognized(self, extras: list[str]) -> str:
        message = f"unrecognized arguments: {' '.join(extras)}"
        known = [flag for flag in self._option_string_actions if flag.startswith("--")]
        flags = [arg.split("=", 1)[0] for arg in extras if arg.startswith("-")]
        near = did_you_mean(flags, known)
        return f"{message}; {near or repr(self.prog + ' --help') + ' lists every flag'}"


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
        kind = {"tau": _tau, "workers": _workers}.get(name) or _parse_type(str(types[name]))
        parser.add_argument(
            flag,
            type=kind,
            default=None,
            metavar=name.upper(),
            # an unset default is explained in the text itself
            help=text if default is None else f"{text} (default: {default})".strip(),
        )


def _mapping(text: str) -> dict[str, Any]:
    """A mapping flag's value: a JSON object, as --optimizer-args '{"betas": [0.9, 0.95]}'."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r} ({exc})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


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


def _workers(text: str) -> int | str:
    """--workers N, or MIN:MAX (a range, which the configuration reads)."""
    return text if ":" in text else int(text)


def _parse_type(annotation: str) -> Any:
    if annotation.startswith("dict"):
        return _mapping
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
        "--model",
        default=None,
        help="needed to import a package.module:factory model, or module:Name of a model object",
    )
    evaluate.add_argument(
        "--loss", default=None, help="module:Name of a loss the run was handed as an object"
    )
    report = sub.add_parser("report", help="draw a run's report.png: loss, scores, learning rate")
    report.add_argument("run", help="a run directory")
    predict = sub.add_parser(
        "predict", help="write a trained model's predictions for a file, batch by batch"
    )
    predict.add_argument(
        "--run", required=True, help="a run directory (its model.safetensors) or a checkpoint"
    )
    predict.add_argument(
        "--data", required=True, help="an .npz (x or x_test), .npy, Parquet (features) or name"
    )
    predict.add_argument("--out", required=True, help="a new .parquet or .csv file")
    predict.add_argument(
        "--model", default=None, help="needed to import a package.module:factory model"
    )
    predict.add_argument(
        "--batch-size", type=positive_int, default=4096, help="rows a batch (default 4096)"
    )
    join = sub.add_parser(
        "join", help="add a worker to a running async, easgd-async or ssp run (elastic)"
    )
    join.add_argument("run_dir", help="the --out directory of the running `ember train`")
    join.add_argument(
        "--epochs", type=positive_int, default=1, help="passes over the data (default 1)"
    )
    leave = sub.add_parser(
        "leave", help="ask a worker of a running worker range's run (--workers MIN:MAX) to leave"
    )
    leave.add_argument("run_dir", help="the --out directory of the running `ember train`")
    leave.add_argument("--worker", type=int, required=True, help="the rank of the worker")
    _add_data_parser(sub)
    _add_lab_parsers(sub)
    return parser


# The commands ember's lab adds, and what each says where the lab is not installed
LAB_COMMANDS = {
    "bench": "compare Spark MLlib and every strategy here; write a report and plots",
    "plan": "predict throughput per strategy and tau; recommend a tau",
}


def _add_lab_parsers(sub: Any) -> None:
    """Each lab command through its entry point, so that ember never imports the lab; where the
    lab is missing, a stand-in that takes any arguments and says how to install it."""
    found = {entry.name: entry for entry in entry_points(group="ember.commands")}
    for name, summary in LAB_COMMANDS.items():
        if name in found:
            found[name].load()(sub)
            continue
        stand_in = sub.add_parser(name, help=f"{summary} (needs ember's lab)", add_help=False)
        stand_in.set_defaults(handler=_lab_missing)  # whatever flags follow


def _lab_missing(args: argparse.Namespace) -> int:
    raise ConfigError(
        f"`ember {args.command}` is a command of ember's lab (the ember-lab package), which is not"
        " installed here: from ember's repository, pip install -e ./lab"
    )


def _add_data_parser(sub: Any) -> None:
    data = sub.add_parser("data", help="datasets for tests and benchmarks")
    generate = data.add_subparsers(dest="data_command", required=True).add_parser(
        "generate", help="write a synthetic Parquet dataset of a given size, row group by group"
    )
    generate.add_argument("--kind", required=True, help="synthetic-lr, mnist-like or mnist")
    generate.add_argument("--size", required=True, help="bytes of training rows, as 4GB or 512MiB")
    generate.add_argument("--out", required=True, help="a new folder: train.parquet, test.parquet")
    generate.add_argument(
        "--features", type=positive_int, default=256, help="synthetic-lr's width (default 256)"
    )
    generate.add_argument("--seed", type=int, default=0, help="(default 0)")


def _stop_on_sigterm(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


def main(argv: list[str] | None = None) -> int:
    # _Parser refuses unknown flags itself, but lets a missing lab command's through
    args, _ = build_parser().parse_known_args(argv)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        if args.command == "train":
            return _train(args)
        if handler := getattr(args, "handler", None):
            return int(handler(args))
        if args.command == "join":
            return _join(args)
        if args.command == "leave":
            from pathlib import Path

            from ember.engines.leave import ask_to_leave

            pid = ask_to_leave(Path(args.run_dir), args.worker)
            print(f"asked worker {args.worker} (pid {pid}) to leave the run")
            return 0
        if args.command == "data":
            from pathlib import Path

            from ember.data.generate import generate, parse_size

            size, out = parse_size(args.size), Path(args.out)
            written = generate(args.kind, size, out, features=args.features, seed=args.seed)
            print(json_text(written.as_dict(), indent=2))
            return 0
        if args.command == "report":
            from ember.metrics.report import draw_report

            print(draw_report(args.run))
            return 0
        if args.command == "predict":
            from ember.predictions import predict

            done = predict(args.run, args.data, args.out, args.model, args.batch_size)
            print(json_text(done, indent=2))
            return 0
        from ember.api import evaluate_checkpoint

        scores = evaluate_checkpoint(args.checkpoint, args.data, args.model, args.loss)
        print(json_text(scores, indent=2))
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
    from ember.engines import ParsedRun, engine_named

    overrides = {name: getattr(args, name) for name in FIELD_NAMES}
    config = run_config(overrides, args.config)
    result = ParsedRun(config, mlflow=config.mlflow).execute(engine_named(config.engine))
    s = result.summary
    name, value = headline(s)
    said = f"test {name} {value:.4f}, " if name != "loss" else ""
    # the epoch lines scored worker 0's parameters or its copy of the center: this is the
    # model the run leaves, the servers' once every worker has made its last exchange
    when = "after every worker's last exchange" if config.uses_server else "at the end"
    print(f"final model ({when}): {said}loss {s['test_loss']:.4f}")
    print(
        f"{s['strategy']} on {s['engine']}: {s['samples_per_second']:,.0f} samples/s, "
        f"{s['train_seconds']:.1f}s; run directory {result.run_dir}"
    )
    return 0


def _join(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ember.engines.join import join_run
    from ember.metrics.records import Record, WorkerProgress, WorkerStart

    def report(record: Record) -> None:
        if isinstance(record, WorkerStart):
            where = f"step {record.schedule_step} of the run's schedule"
            print(f"joined as worker {record.rank} at {where}", file=sys.stderr, flush=True)
        elif isinstance(record, WorkerProgress):
            print(
                f"worker {record.rank}: epoch {record.epoch}, step {record.step},"
                f" loss {record.loss:.4f}, lr {record.lr or 0:.6g},"
                f" {record.samples_per_second:,.0f} samples/s",
                file=sys.stderr,
                flush=True,
            )

    done = join_run(Path(args.run_dir), args.epochs, report)
    speed = done.samples / max(done.seconds, 1e-9)
    print(f"worker {done.rank} left the run after {done.steps} steps ({speed:,.0f} samples/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
