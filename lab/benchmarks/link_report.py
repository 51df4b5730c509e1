"""One report from several `ember bench --hosts` runs: their records together, each link's rows
predicted again by today's throughput model at the rate (and latency) that link measured.

A full comparison at every link rate takes hours on a small machine, so it is often run one
rate (or one set of rows) at a time; this puts those runs side by side in one report.md:

    python lab/benchmarks/link_report.py --out docs/comparison/links RUN_DIR [RUN_DIR ...]

Each RUN_DIR is an `ember bench --out` directory (results.jsonl and settings.json). The single
row of the first run is every link's baseline; each run's own calibration predicts its rows,
and a row that an earlier run measured too is a further repetition of it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ember_lab.bench.predict import predict_results
from ember_lab.bench.report import write_report


def merged(runs: list[Path]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The runs' records, predicted again, and settings that describe them all."""
    records: list[dict[str, Any]] = []
    settings: dict[str, Any] = {}
    for index, run in enumerate(runs):
        given = _read_json(run / "settings.json", (run / "settings.json").read_text())
        lines = (run / "results.jsonl").read_text().splitlines()
        rows = [_read_json(run / f"results.jsonl:{n}", line) for n, line in enumerate(lines, 1)]
        for number, row in enumerate(rows, 1):
            _check_row(run / f"results.jsonl:{number}", row)
        # the first run's single row is the baseline; later runs' copies would stand beside it
        rows = [r for r in rows if r.get("link") or index == 0]
        seen = {(r["task"], r["row"], r.get("link")) for r in records}
        for row in rows:  # a row an earlier run measured too counts as a further repetition
            row["repeat"] += (row["task"], row["row"], row.get("link")) in seen
        records += predict_results(rows, given.get("calibration", {}))
        if not settings:
            settings = {**given, "out": "", "links": [], "strategies": [], "runs": []}
            settings["links_run"] = {**given.get("links_run", {}), "measured": {}}
        settings["runs"].append(run.name)
        for key in ("links", "strategies"):
            settings[key] += [name for name in given[key] if name not in settings[key]]
        settings["links_run"]["measured"].update(given.get("links_run", {}).get("measured", {}))
    return records, settings


def _read_json(where: Path, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"{where}: not JSON ({exc.msg}, column {exc.colno})") from None


def _check_row(where: Path, row: Any) -> None:
    """Refuse, naming the line, a row whose fields the predictions read are not as
    `ember bench` writes them (a hand-edited or truncated file)."""

    def number(value: Any) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool)

    def refuse(what: str) -> None:
        raise SystemExit(f"{where}: {what}")

    if not isinstance(row, dict):
        refuse("not a JSON object")
    for name, kind in (("task", str), ("row", str), ("repeat", int)):
        if not isinstance(row.get(name), kind):
            refuse(f"field {name!r} must be a {kind.__name__}")
    if row.get("link") and not number(row.get("link_bytes_per_second")):
        refuse("a link row needs 'link_bytes_per_second', a number")
    probe = row.get("link_exchange")
    if probe is not None:
        fields = ("bytes", "seconds", "client_cpu", "server_cpu")
        if not isinstance(probe, dict) or not all(number(probe.get(f)) for f in fields):
            refuse(f"field 'link_exchange' must hold the numbers {', '.join(fields)}")
        if probe["bytes"] <= 0 or not number(probe.get("kernel_cpu", 0.0)):
            refuse("field 'link_exchange' needs bytes > 0 and a number for kernel_cpu")
    choices = row.get("tau_choices")
    if choices is not None:
        pairs = list(choices.values()) if isinstance(choices, dict) else [None]
        if not all(
            isinstance(chosen, list)
            and all(isinstance(p, list) and len(p) == 2 and all(map(number, p)) for p in chosen)
            for chosen in pairs
        ):
            refuse("field 'tau_choices' must map each worker to a list of [step, tau] pairs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="ember bench --out directories")
    parser.add_argument("--out", type=Path, required=True, help="where report.md is written")
    args = parser.parse_args(argv)
    for run in args.runs:
        if not (run / "results.jsonl").is_file() or not (run / "settings.json").is_file():
            print(f"{run}: not an ember bench directory (no results.jsonl and settings.json)")
            return 2
    records, settings = merged(args.runs)
    settings["out"] = str(args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "results.jsonl").open("w") as file:
        file.writelines(json.dumps(r) + "\n" for r in records)
    (args.out / "settings.json").write_text(json.dumps(settings, indent=2) + "\n")
    written = write_report(records, args.out, settings)
    print(f"{len(records)} rows; wrote {', '.join(map(str, written))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
