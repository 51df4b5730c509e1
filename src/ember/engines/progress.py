"""The live progress bar of a run: epoch, samples/s, loss and the latest accuracy."""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm


class Progress:
    """A tqdm bar over all workers' samples; on a non-terminal it prints one line per epoch."""

    def __init__(self, total: int, enabled: bool = True) -> None:
        self.interactive = enabled and sys.stderr.isatty()
        self.enabled = enabled
        self._bar = tqdm(
            total=total,
            unit="samples",
            unit_scale=True,
            dynamic_ncols=True,
            disable=not self.interactive,
            file=sys.stderr,
        )
        self.seen: dict[int, int] = {}  # samples per rank, from each worker's step count
        self.speed: dict[int, float] = {}
        self.loss: dict[int, float] = {}
        self.epoch, self.accuracy = 0, float("nan")

    def update(self, record: dict[str, Any]) -> None:
        kind, rank = record.get("kind"), record.get("rank", 0)
        if kind == "worker":
            self.speed[rank] = record["samples_per_second"]
            self.loss[rank] = record["loss"]
            self.epoch = max(self.epoch, record["epoch"])
        elif kind == "eval":
            self.accuracy = record["test_accuracy"]
            if self.enabled and not self.interactive:
                print(
                    f"epoch {record['epoch']}: test accuracy {self.accuracy:.4f} "
                    f"(worker 0), {sum(self.speed.values()):,.0f} samples/s",
                    file=sys.stderr,
                    flush=True,
                )
        elif kind in ("rejoin", "failure"):
            self._bar.write(f"{kind}: {record}")
        if kind == "worker" and "samples" in record:
            self.seen[rank] = record["samples"]
            self._bar.n = sum(self.seen.values())
        if kind in ("worker", "eval"):
            loss = sum(self.loss.values()) / max(1, len(self.loss))
            self._bar.set_postfix(
                epoch=self.epoch,
                samples_s=f"{sum(self.speed.values()):,.0f}",
                loss=f"{loss:.4f}",
                acc=f"{self.accuracy:.4f}",
                refresh=False,
            )
            self._bar.refresh()

    def set_completed(self, samples: int) -> None:
        """All workers together have trained on `samples` (at most the total) so far."""
        self._bar.n = min(self._bar.total, samples)
        self._bar.refresh()

    def note(self, text: str) -> None:
        """A line about the run (a restart, a failover) above the bar, or on its own."""
        if self.interactive:
            self._bar.write(text, file=sys.stderr)
        elif self.enabled:
            print(text, file=sys.stderr, flush=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.close()
