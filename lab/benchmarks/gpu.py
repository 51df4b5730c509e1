"""gpu: ember's workers on a GPU beside the same runs on the CPU, in float32 and bf16-mixed.

    python lab/benchmarks/gpu.py [--quick] [--cpu-only] [--epochs E] [--out FILE]

Tasks: the main job (MNIST, the mlp) and a CNN with BatchNorm (the zoo's cnn_bn on MNIST),
each with `single` (one worker), `easgd-async` (two workers, on one GPU when there is one) and
`allreduce` (two workers), each in --precision 32 and bf16-mixed. Every row is one `ember
train` process of this checkout on the local engine, run with --device cpu and, where torch
sees CUDA, with --device cuda; the table puts the test accuracy and samples/s (summary.json:
the workers' training loops) of each device side by side. Without CUDA it says so and runs the
CPU rows only. --quick: the digits, one epoch (a smoke test, for a machine without a GPU).
One pass, meant for an accelerator machine to run in one go: the rows run in sequence, each
bounded by RUN_SECONDS.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).resolve().parents[2] / "src"
sys.path.insert(0, str(SOURCE))  # this checkout's ember, installed or not

from common import ember_train  # noqa: E402

TASKS = {"mlp": ["--model", "mlp"], "cnn_bn": ["--model", "cnn_bn"]}
STRATEGIES = {
    "single": ["--strategy", "single", "--workers", "1"],
    "easgd-async": ["--strategy", "easgd-async", "--workers", "2"],
    "allreduce": ["--strategy", "allreduce", "--workers", "2"],
}
PRECISIONS = ("32", "bf16-mixed")
RUN_SECONDS = 600  # one training process, at most
FIGURES = ("test_accuracy", "samples_per_second", "train_seconds", "devices")


def cuda_devices() -> int:
    """GPUs torch sees here (0 without CUDA), asked in a child so this process stays bare."""
    ask = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    done = subprocess.run(
        [sys.executable, "-c", ask], capture_output=True, text=True, timeout=120, check=True
    )
    return int(done.stdout.strip() or 0)


def train(flags: list[str], data: str, epochs: int) -> dict[str, Any]:
    """One `ember train` with `flags`; its summary's figures, or the last line of its error."""
    try:
        summary = ember_train(
            ["--data", data, "--epochs", str(epochs), *flags], SOURCE, RUN_SECONDS
        )
    except RuntimeError as exc:
        return {"error": str(exc).strip().splitlines()[-1]}
    return {key: summary[key] for key in FIGURES}


def rows(devices: list[str], data: str, epochs: int) -> list[dict[str, Any]]:
    found = []
    for task, task_flags in TASKS.items():
        for strategy, strategy_flags in STRATEGIES.items():
            for precision in PRECISIONS:
                row: dict[str, Any] = {"task": task, "strategy": strategy, "precision": precision}
                for device in devices:
                    flags = [*task_flags, *strategy_flags, "--precision", precision]
                    started = time.perf_counter()
                    row[device] = train([*flags, "--device", device], data, epochs)
                    row[device]["wall_seconds"] = time.perf_counter() - started
                    print(f"  {task} {strategy} {precision} {device}: {row[device]}", flush=True)
                found.append(row)
    return found


def table(found: list[dict[str, Any]], devices: list[str]) -> str:
    head = "| task | strategy | precision |"
    for device in devices:
        head += f" {device} accuracy | {device} samples/s |"
    if len(devices) == 2:
        head += " cuda / cpu |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in found:
        line = f"| {row['task']} | {row['strategy']} | {row['precision']} |"
        for device in devices:
            figures = row[device]
            if "error" in figures:
                line += f" error: {figures['error'][:60]} | |"
            else:
                line += f" {figures['test_accuracy']:.4f} | {figures['samples_per_second']:,.0f} |"
        if len(devices) == 2:
            both = [row[d].get("samples_per_second") for d in devices]
            ratio = both[1] / both[0] if all(both) else None
            line += f" {ratio:.2f}x |" if ratio is not None else " |"
        lines.append(line)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="digits, one epoch: a smoke test")
    parser.add_argument("--cpu-only", action="store_true", help="the CPU rows alone")
    parser.add_argument("--epochs", type=int, default=1, help="epochs of each run (default 1)")
    parser.add_argument("--out", type=Path, default=None, help="also write the rows as JSON")
    options = parser.parse_args()
    data, epochs = ("digits", 1) if options.quick else ("mnist", options.epochs)
    gpus = 0 if options.cpu_only else cuda_devices()
    if options.cpu_only:
        print("--cpu-only: the CPU rows alone", flush=True)
    elif gpus == 0:
        print("torch sees no CUDA device here: the CPU rows alone", flush=True)
    else:
        print(f"torch sees {gpus} CUDA device(s): worker i takes GPU i mod {gpus}", flush=True)
    devices = ["cpu", "cuda"] if gpus else ["cpu"]
    started = time.perf_counter()
    found = rows(devices, data, epochs)
    print(f"\n{data}, {epochs} epoch(s), {time.perf_counter() - started:.0f} s in all\n")
    print(table(found, devices))
    if options.out is not None:
        options.out.write_text(json.dumps({"data": data, "epochs": epochs, "rows": found}))


if __name__ == "__main__":
    main()
