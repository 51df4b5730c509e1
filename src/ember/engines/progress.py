"""What a user sees while a run runs: its start-up phases, then one bar over all workers."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm import tqdm

from ember.metrics import headline
from ember.metrics.records import (
    Divergence,
    Evaluation,
    Note,
    Record,
    WorkerProgress,
    WorkerStart,
)

# tqdm's own rate and remaining time are left out: its rate, smoothed over the start-up, is
# not the workers' speed. The one speed shown is the workers' summed samples/s, in the postfix.
PHASE_FORMAT = "{desc}"
TRAINING_FORMAT = "{percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"
# the workers' steps waited on their batches this share of the time: the disk (or the shuffle)
# sets the pace, not compute or the network
INPUT_BOUND = 0.3


class Progress:
    """On a terminal: the phase under way as it happens (and a line with its duration once it
    ends), then a bar over all workers' samples with their summed samples/s and, once there
    is such a rate, the time left at it. Elsewhere: a line per phase and one per epoch."""

    def __init__(self, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.interactive = enabled and self.stream.isatty()
        self._bar = tqdm(
            total=None,
            bar_format=PHASE_FORMAT,
            unit="samples",
            unit_scale=True,
            dynamic_ncols=True,
            disable=not self.interactive,
            file=self.stream,
        )
        self.phases: list[str] = []  # the start-up phases so far, in order
        self.training = False  # the first progress record arrived: the bar shows samples
        self.workers, self.samples_per_step = 0, 0
        self.started: set[int] = set()  # ranks whose worker loop began
        self.seen: dict[int, int] = {}  # samples per rank, from each worker's step count
        self.speed: dict[int, float] = {}
        self.loss: dict[int, float] = {}
        self.data_wait: dict[int, float] = {}  # share of the last interval spent on data
        self.epoch, self.score = 0, ("accuracy", float("nan"))  # worker 0's latest headline
        self._said_epoch = 0  # the last epoch a line was printed for
        self._said_at = (0, 0.0)  # the samples and training seconds that line was at
        self.diverged: set[int] = set()  # ranks whose NaN loss was said (once each)
        self.said: set[str] = set()  # the workers' notes, each said once for all of them
        self._phase_began = time.monotonic()

    def phase(self, name: str) -> None:
        """A start-up phase begins (and the previous one ends)."""
        if self.interactive:  # the new name first: the line ending the old one redraws the bar
            self._bar.set_description_str(f"ember: {name}...", refresh=False)
        self._end_phase()
        self.phases.append(name)
        self._phase_began = time.monotonic()
        if self.interactive:
            self._bar.refresh()
        else:
            self._say(f"ember: {name}")

    def start(self, total: int, workers: int, samples_per_step: int) -> None:
        """The workers are starting: `total` samples to train on, `samples_per_step` per step
        of each of the `workers`."""
        self._bar.total = total
        self.workers, self.samples_per_step = workers, samples_per_step

    @property
    def samples_per_second(self) -> float:
        return sum(self.speed.values())

    def update(self, record: Record) -> None:
        if isinstance(record, WorkerStart):
            self.started.add(record.rank)
            if not self.training and len(self.started) == self.workers:
                self.phase("waiting for the first step")
            elif not self.training and self.interactive and self.phases:  # whom it waits for
                ready = f"{len(self.started)} of {self.workers} ready"
                self._bar.set_description_str(f"ember: {self.phases[-1]} ({ready})...")
        elif isinstance(record, WorkerProgress):
            self._progress(record)
        elif isinstance(record, Evaluation):
            self._evaluation(record)
        elif isinstance(record, Divergence) and record.rank not in self.diverged:
            self.diverged.add(record.rank)
            self.warn(
                f"ember: warning: worker {record.rank}'s training loss is {record.loss} at step"
                f" {record.step} (epoch {record.epoch}): training has diverged; a lower"
                " --lr usually helps"
            )
        elif isinstance(record, Note) and record.text not in self.said:
            self.said.add(record.text)
            self.note(record.text)
        if isinstance(record, (WorkerProgress, Evaluation)) and self.training:
            self._bar.set_postfix_str(self._postfix(), refresh=False)
            self._bar.refresh()

    def _progress(self, record: WorkerProgress) -> None:
        rank = record.rank
        self.speed[rank] = record.samples_per_second
        self.loss[rank] = record.loss
        self.data_wait[rank] = record.data_wait_fraction or 0.0
        self.epoch = max(self.epoch, record.epoch)
        self.seen[rank] = record.step * self.samples_per_step or record.samples
        if not self.training:
            self._bar.set_description_str("", refresh=False)
            self._bar.bar_format = TRAINING_FORMAT
            self._end_phase()
            self.training = True
        self._bar.n = min(self._bar.total or 0, sum(self.seen.values()))

    def _evaluation(self, record: Evaluation) -> None:
        self.score = headline(record.scores)
        # whose parameters: the final model, scored at the end, is the servers' after every
        # worker's last exchange, so the last epoch's line may differ from it
        center = record.source.startswith("center")
        whose = "center as of worker 0's last exchange" if center else "worker 0's parameters"
        if record.test_set and record.test_set.startswith("subset"):
            whose = f"{whose}, {record.test_set}"
        # one line at each epoch's end, not at the evaluations within it (--eval-every);
        # a retried or replayed epoch is said once
        if record.epoch_end and record.epoch > self._said_epoch:
            self._said_epoch = record.epoch
            self.note(
                f"epoch {record.epoch}: test {self.score[0]} {self.score[1]:.4f} "
                f"({whose}){self._epoch_rate(record)}"
                + (f", {self.input_bound()}" if self.input_bound() else "")
            )

    def _epoch_rate(self, record: Evaluation) -> str:
        """All workers' samples/s over the epoch the line ends, from the evaluation's own
        counts: not the last progress record's rate, which may be an epoch old (or none)."""
        samples, seconds = self._said_at
        self._said_at = (record.samples, record.seconds)
        if record.seconds <= seconds or record.samples <= samples:  # counts it did not send
            rate = self.samples_per_second
            return f", {rate:,.0f} samples/s" if rate > 0 else ""
        return f", {(record.samples - samples) / (record.seconds - seconds):,.0f} samples/s"

    def _postfix(self) -> str:
        loss = sum(self.loss.values()) / max(1, len(self.loss))
        parts = [f"{self.samples_per_second:,.0f} samples/s"]
        if self.samples_per_second > 0 and self._bar.total:
            left = max(0, self._bar.total - self._bar.n) / self.samples_per_second
            parts.append(f"{tqdm.format_interval(left)} left")
        parts += [f"epoch {self.epoch}", f"loss {loss:.4f}"]
        if self.input_bound():
            parts.append(self.input_bound())
        name, value = self.score
        if value == value:  # not NaN: worker 0 has evaluated
            parts.append(f"{'acc' if name == 'accuracy' else name} {value:.4f}")
        return ", ".join(parts)

    def input_bound(self) -> str:
        """What to say when the workers mostly wait for their batches; else nothing."""
        waiting = sum(self.data_wait.values()) / max(1, len(self.data_wait))
        if waiting <= INPUT_BOUND:
            return ""
        return f"input-bound: {waiting:.0%} of the time waiting on data"

    def set_completed(self, samples: int) -> None:
        """All workers together have trained on `samples` (at most the total) so far."""
        self._bar.n = min(self._bar.total or 0, samples)
        if self.training:
            self._bar.set_postfix_str(self._postfix(), refresh=False)
        self._bar.refresh()

    def note(self, text: str) -> None:
        """A line about the run (an epoch, a restart, a failover) above the bar, or alone."""
        if self.interactive:
            self._bar.write(text, file=self.stream)
        else:
            self._say(text)

    def warn(self, text: str) -> None:
        """A line the user must see, with the bar or without it."""
        if self.interactive:
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def _say(self, text: str) -> None:
        if self.enabled:
            print(text, file=self.stream, flush=True)

    def _end_phase(self) -> None:
        if self.interactive and self.phases and not self.training:
            seconds = time.monotonic() - self._phase_began
            self._bar.write(f"ember: {self.phases[-1]} ({seconds:.1f} s)", file=self.stream)

    def __str__(self) -> str:
        """The bar's line as a terminal shows it now."""
        return str(self._bar)

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
