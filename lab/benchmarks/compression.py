"""Bytes on the wire per sample, and final accuracy, with and without `--compress`.

Every strategy that talks to a parameter server runs once per codec, in this one invocation, with
the same model, data, batch, learning rate and epochs; the table sets each codec beside `none`.
Bytes are what the workers' exchanges sent and received, encoded (summary.json's bytes_pushed and
bytes_pulled), so the ratio does not depend on the machine; accuracy is one run's.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from common import environment, markdown_table

STRATEGIES = ("async", "bsp", "easgd-async")
CODECS = ("none", "fp16", "int8")


def run(strategy: str, codec: str, data: str, epochs: int) -> dict[str, Any]:
    import ember

    with tempfile.TemporaryDirectory(prefix="ember-compress-") as tmp:
        summary = ember.fit(
            strategy=strategy,
            workers=2,
            model="mlp",
            data=data,
            epochs=epochs,
            compress=codec,
            out=str(Path(tmp) / "run"),
            show_progress=False,
        ).summary
    moved = summary["bytes_pushed"] + summary["bytes_pulled"]
    return {
        "strategy": strategy,
        "compress": codec,
        "bytes_per_sample": moved / summary["samples"],
        "test_accuracy": summary["test_accuracy"],
        "samples_per_second": summary["samples_per_second"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="mnist")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
    parser.add_argument("--codecs", nargs="+", default=list(CODECS))
    parser.add_argument("--quick", action="store_true", help="digits, 1 epoch: a smoke test")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON")
    args = parser.parse_args()
    data, epochs = ("digits", 1) if args.quick else (args.data, args.epochs)
    rows = [run(s, c, data, epochs) for s in args.strategies for c in args.codecs]
    baseline = {r["strategy"]: r["bytes_per_sample"] for r in rows if r["compress"] == "none"}
    table = []
    for r in rows:
        plain = baseline.get(r["strategy"])
        ratio = f"{plain / r['bytes_per_sample']:.2f}x" if plain else "-"
        table.append(
            [
                r["strategy"],
                r["compress"],
                f"{r['bytes_per_sample']:,.0f}",
                ratio,
                f"{r['test_accuracy']:.4f}",
                f"{r['samples_per_second']:,.0f}",
            ]
        )
    headers = ["strategy", "compress", "bytes/sample", "vs none", "test accuracy", "samples/s"]
    print(f"{data}, mlp, 2 workers, {epochs} epochs")
    print(markdown_table(headers, table))
    if args.out is not None:
        args.out.write_text(json.dumps({"environment": environment(), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
