"""One run lifecycle for every engine, between rundir.py's opening and closing of its
directory: the servers kept alive and checkpointed while workers train, and what they hold
saved on failure."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, NoReturn

from ember.checkpoint import latest_valid_checkpoint
from ember.config import Strategy
from ember.config.tau import diloco_period_warning
from ember.engines.phases import PeakMemory, Timeline, pids_of
from ember.engines.process import reap
from ember.engines.progress import Progress
from ember.engines.rundir import RunResult, RunSetup, finish_run
from ember.engines.userrun import finish_loop
from ember.engines.workers import Exit, Workers
from ember.errors import CheckpointError, EmberError, WorkerFailed
from ember.metrics import tracking
from ember.metrics.records import (
    Divergence,
    Evaluation,
    Record,
    Returned,
    RunEvent,
    ServerEvent,
    WorkerDone,
    WorkerRestart,
    WorkerStart,
)
from ember.wire import warn_if_exposed
from ember.worker.spec import checkpoint_meta

POLL_SECONDS = 0.25  # the watch loop's poll: how soon a record, an exit or a tick is seen
MEMBERS_SECONDS = 1.0  # how often a worker range's run asks the servers who is in


def exit_how(exitcode: int | None) -> str:
    """How a worker ended, as a message says it."""
    return f"exited with code {exitcode}" if exitcode is not None else "raised"


class Run:
    """A run as an engine drives it, from prepare_run to finish_run: the engine starts and
    polls its workers, relays what they report, and calls `tick` between polls; leaving the
    `with` block reaps the servers, whatever happened."""

    def __init__(
        self,
        setup: RunSetup,
        progress: Progress,
        timeline: Timeline | None = None,
        memory: PeakMemory | None = None,
    ) -> None:
        self.setup = setup
        self.timeline = timeline  # the engine's, when it times the run's phases
        self.memory = memory if memory is not None else PeakMemory()
        self._sampled = 0.0  # perf_counter() of the last memory sample
        self.config = setup.config
        self.parts = setup.parts
        self.servers = setup.server_group() if self.parts.strategy.uses_server else None
        self.progress = progress  # the engine's, open since its first phase
        self.done: dict[int, WorkerDone] = {}  # each rank's last totals
        self.total = 0  # samples all workers train on, once `watching` knows their rows
        self._reported = 0  # how many of the servers' events metrics.jsonl has
        self._members: dict[str, int] = {}  # a range's membership as last told
        self._members_at = 0.0  # perf_counter() of the last question
        self.divergences: list[Divergence] = []  # each worker's first non-finite loss
        self.evaluations: list[Evaluation] = []  # worker 0's, in order: a collapse shows there
        self.returned: Returned | None = None  # ember.run: rank 0's return value

    def start_servers(
        self, phase: str = "starting parameter servers", rows_per_worker: int = 0
    ) -> list[str]:
        """The servers' addresses once they listen (none for a strategy without them); a
        learning-rate schedule on them runs over the steps of `rows_per_worker` rows."""
        if self.servers is None:
            return []
        self.progress.phase(phase)
        if self.timeline is not None:
            self.timeline.mark("servers")
        training = self.parts.training
        addresses = self.servers.start(rows_per_worker // training.batch_size * training.epochs)
        warn_if_exposed(addresses, self.parts.servers.encrypt)  # always, bar or not
        return addresses

    @contextmanager
    def watching(self, rows_per_worker: int) -> Iterator[Progress]:
        """The progress bar while the workers train on `rows_per_worker` rows each (whole
        batches of them, as the worker loop takes them)."""
        training, strategy = self.parts.training, self.parts.strategy
        batches = rows_per_worker // training.batch_size
        self.total = training.epochs * batches * training.batch_size * strategy.workers
        if strategy.strategy is Strategy.DILOCO and strategy.tau_policy == "fixed":
            warning = diloco_period_warning(strategy.tau, training.epochs * batches)
            if warning is not None:  # before the first step, where the user can still act
                self.setup.metrics.write(RunEvent(event="warning", details={"text": warning}))
                self.progress.warn(f"ember: warning: {warning}")
        self.progress.start(self.total, strategy.workers, training.batch_size)
        try:
            yield self.progress
        finally:
            self.progress.close()

    def watch(self, workers: Workers, rows_per_worker: int) -> int:
        """Start `workers` and watch them until every one has finished: relay what they report,
        restart a rank that dies (up to max_restarts each, under a strategy whose servers
        hold its state) or end the run when it may not be restarted, and tick between
        polls. Returns how many restarts there were."""
        strategy, engine = self.parts.strategy, self.parts.engine
        incarnations = [0] * strategy.workers
        with self.watching(rows_per_worker) as bar:
            workers.start()
            while workers.running():
                polled = workers.poll(POLL_SECONDS)
                for record in polled.shown:
                    bar.update(self.described(record))
                for record in polled.records:
                    if isinstance(record, WorkerDone):  # its peak, before it exits
                        self.sample_memory(workers.pids())
                    self.relay(record)
                for event, text in polled.notes:
                    self.note(event, text)
                for gone in sorted(polled.exits, key=lambda e: e.rank):
                    if gone.final:  # its data, model or code: every worker would fail alike
                        self.fail(*workers.failure(gone, "not restarted: it would fail again"))
                    if (
                        not workers.restarts_ranks
                        or not strategy.uses_server
                        or incarnations[gone.rank] >= engine.max_restarts
                    ):
                        self.fail(*workers.failure(gone, ""))
                    incarnations[gone.rank] += 1
                    self._note_restart(gone, incarnations[gone.rank])
                    workers.restart(gone.rank, incarnations[gone.rank])
                self.tick(workers.pids())
            bar.set_completed(self.total)  # every worker finished, whatever it last reported
        return sum(incarnations)

    def _note_restart(self, gone: Exit, incarnation: int) -> None:
        last = gone.error.strip().splitlines()[-1:] or [""]
        record = WorkerRestart(
            rank=gone.rank, incarnation=incarnation, exitcode=gone.exitcode, error=gone.error
        )
        how = exit_how(gone.exitcode)
        self.note(
            record, f"worker {gone.rank} {how} {last[0]}; restarted (incarnation {incarnation})"
        )

    def described(self, record: Record) -> Record:
        """A worker's record as the run tells it: an evaluation says which test rows it
        scored, all of the test set or a subset (what a Spark task was handed)."""
        if not isinstance(record, Evaluation) or not record.test_rows:
            return record
        rows, every = record.test_rows, len(self.setup.dataset.y_test)
        scored = f"subset of {rows:,} rows" if rows < every else f"all {rows:,} rows"
        return replace(record, test_set=scored)

    def relay(self, record: Record) -> None:
        """A worker's record: to metrics.jsonl and the bar; its totals are kept for the end."""
        if isinstance(record, Returned):  # what ember.run returns: no metric, maybe large
            self.returned = record
            return
        record = self.described(record)
        self.setup.metrics.write(record)
        tracking.record(record)  # worker 0's epoch evaluations, when MLflow tracks the run
        self.progress.update(record)
        if isinstance(record, WorkerDone):
            self.done[record.rank] = record
        elif isinstance(record, Divergence):
            self.divergences.append(record)
        elif isinstance(record, Evaluation):
            self.evaluations.append(record)
        elif isinstance(record, WorkerStart) and record.rank == 0 and record.incarnation == 0:
            self._say_where_it_resumes(record)
        # every worker at its first step
        all_started = len(self.progress.started) >= self.parts.strategy.workers
        if isinstance(record, WorkerStart) and all_started and self.timeline is not None:
            self.timeline.mark_once("training")

    def _say_where_it_resumes(self, start: WorkerStart) -> None:
        """A resumed run says where it goes on from, once worker 0 knows its first step."""
        resume, epochs = self.setup.resume, self.parts.training.epochs
        if resume is None or start.total_steps <= 0:
            return
        epoch = min(epochs, start.first_step * epochs // start.total_steps + 1)
        self.progress.warn(
            f"ember: resuming from {resume.path}: epoch {epoch} of {epochs}"
            f" (step {start.first_step:,} of {start.total_steps:,})"
        )

    def note(self, record: Record, text: str) -> None:
        """Something that happened to the run: a record in metrics.jsonl, a line for the user."""
        self.setup.metrics.write(record)
        self.progress.note(text)

    def fail(self, record: Record, message: str) -> NoReturn:
        """End the run for a worker's failure: `record` to metrics.jsonl, `message` raised."""
        self.setup.metrics.write(record)
        raise WorkerFailed(message)

    def sample_memory(self, pids: Iterable[int | None] = ()) -> None:
        """Note the peak memory of the servers and the engine's other processes `pids`."""
        servers = pids_of(self.servers.processes) if self.servers is not None else []
        self.memory.sample([*pids, *servers])
        self._sampled = time.perf_counter()

    def tick(self, pids: Iterable[int | None] = ()) -> None:
        """Between polls of the workers: sample memory (of the servers and `pids`), replace a
        dead server, checkpoint when due, and tell what the servers went through."""
        if time.perf_counter() - self._sampled > 0.1:  # /proc is cheap, not free
            self.sample_memory(pids)
        if self.servers is None:
            return
        self.servers.keep_alive(self.setup.checkpoints)
        self.servers.checkpoint_if_due(self.setup.checkpoints, self._meta())
        for event in self.servers.events[self._reported :]:
            self._reported += 1
            self.note(ServerEvent(details=event), _describe(event))
        if self.parts.strategy.workers_max is not None:
            self._watch_members()

    def _watch_members(self) -> None:
        """A worker range's membership as it changes: a record and a line each time."""
        if self.servers is None or time.perf_counter() - self._members_at < MEMBERS_SECONDS:
            return
        self._members_at = time.perf_counter()
        now = self.servers.membership()
        if now is None or now == self._members:
            return
        self._members = now
        text = f"members: {now['members']} ({now['joins']} joined, {now['leaves']} left so far)"
        below = self.parts.strategy.workers
        if 0 < now["members"] < below:
            seconds = self.parts.servers.worker_timeout
            text += f"; below MIN {below}: the members wait up to {seconds:g} s for others"
        self.note(RunEvent(event="membership", details=now), text)

    def _let_members_finish(self) -> None:
        """A range's members that the engine did not start (`ember join`) may still train
        the last pieces when its own are done: the servers serve them until they are out,
        up to the worker timeout (a silent one is dropped by then)."""
        if self.parts.strategy.workers_max is None or self.servers is None:
            return
        deadline = time.perf_counter() + self.parts.servers.worker_timeout
        while time.perf_counter() < deadline:
            now = self.servers.membership()
            if now is None or now["members"] == 0:
                return
            time.sleep(0.2)

    def finish(self, seconds: float, extra: dict[str, Any]) -> RunResult:
        """The last checkpoint (the servers' state, else worker 0's own), the servers stopped,
        and the final evaluation of what the workers trained in `seconds`."""
        checkpoints, extra = self.setup.checkpoints, dict(extra)
        params, final = None, []
        self.sample_memory()
        if self.timeline is not None:
            self.timeline.mark("checkpoint")
        if self.servers is not None:
            self._let_members_finish()
            params = self.servers.snapshot()["params"]
            self.servers.checkpoint(checkpoints, self._meta())
            final = self.servers.stop()
            extra["server"] = _merge_server_stats(final)
            extra["server"]["failovers_and_restarts"] = self.servers.events
            extra.update(_membership(final))
            extra["leaves"] += sum(bool(d.left) for d in self.done.values())  # its own
        extra["wire"] = _wire_stats(final, self.parts.servers.encrypt and self.servers is not None)
        if extra["wire"]["encrypted"]:
            extra["wire"]["cipher"] = self.parts.servers.wire_cipher
        workers = [self.done[rank].flat() for rank in sorted(self.done)]
        extra.update(_divergence(self.divergences))
        if self.timeline is not None:  # the engine's own figures, its processes all known
            self.timeline.mark("evaluation")
            extra.update(self.timeline.summary(), peak_memory_bytes=self.memory.total())
        result: RunResult
        if self.setup.loop is not None:  # ember.run: the user's loop scored what it wanted
            last = latest_valid_checkpoint(checkpoints) if params is None else None
            if last is not None:  # rank 0's, under single and allreduce (save_loop_model)
                params = last.tensors["params"]
            result = finish_loop(self.setup, params, workers, seconds, extra, self.returned)
        else:
            last = latest_valid_checkpoint(checkpoints)
            if params is None:
                if last is None:
                    raise CheckpointError(f"worker 0 left no checkpoint in {checkpoints}")
                params = last.tensors["params"]
            extra["checkpoint"] = str(last.path) if last else None
            history = [record.scores for record in self.evaluations]
            result = finish_run(self.setup, params, workers, seconds, extra, history)
        if self.config.report:  # after summary.json, whose final figures it shows
            from ember.metrics.report import draw_report

            draw_report(self.setup.run_dir)
        if self.timeline is not None:
            self.timeline.mark("teardown")
        return result

    @contextmanager
    def saving_on_failure(self) -> Iterator[None]:
        """Around the workers' training: an exception out of it (the engine has stopped its
        workers by then, so the servers' state is final) first saves what the servers hold."""
        try:
            yield
        except BaseException:
            if self.servers is not None and self.servers.addresses:
                self._save_what_the_servers_hold()
            raise

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *_: object) -> None:
        if self.servers is not None:
            reap(self.servers.processes)

    def _save_what_the_servers_hold(self) -> None:
        """On failure or Ctrl-C, a last checkpoint keeps the progress made since the previous
        one (briefly: a server that does not answer at once is not going to)."""
        assert self.servers is not None
        metrics, slots = self.setup.metrics, self.servers.primary_slots
        if not all(s.process is not None and s.process.exitcode is None for s in slots):
            metrics.write(RunEvent(event="final checkpoint skipped: a server is down"))
            return
        try:
            path = self.servers.checkpoint(self.setup.checkpoints, self._meta(), timeout=10.0)
        except EmberError as exc:
            failed = RunEvent(event="final checkpoint failed", details={"error": str(exc)})
            metrics.write(failed)
            return
        metrics.write(RunEvent(event="final checkpoint", details={"path": str(path)}))

    def _meta(self) -> dict[str, Any]:
        setup = self.setup
        return checkpoint_meta(self.config, setup.layout, 0, setup.shape, setup.objects)


def _divergence(records: list[Divergence]) -> dict[str, Any]:
    """The summary's word on divergence: whether any worker's loss was NaN or infinite, and
    the earliest step it was, with its worker."""
    first = min(records, key=lambda r: (r.step, r.rank), default=None)
    fields = ("rank", "incarnation", "step", "epoch", "loss")
    return {
        "diverged": first is not None,
        "first_non_finite_loss": {k: getattr(first, k) for k in fields} if first else None,
    }


def _describe(event: dict[str, Any]) -> str:
    details = ", ".join(f"{k}: {v}" for k, v in event.items() if k not in ("event", "server"))
    return f"{event.get('server', 'parameter servers')} {event['event']} ({details})"


def _wire_stats(stats: list[dict[str, Any]], encrypt: bool) -> dict[str, Any]:
    """Encrypted (`encrypt` when no server answered), shared-memory payloads, requests striped."""
    shared = (s.get("shared_memory", {}) for s in stats)
    lanes = [s.get("striping", {}) for s in stats]
    carried = sum(int(m.get("payloads", 0)) + int(m.get("replies", 0)) for m in shared)
    return {
        "encrypted": all(bool(s.get("encrypted")) for s in stats) if stats else encrypt,
        "shared_memory_payloads": carried,
        "striped_requests": sum(int(m.get("striped_requests", 0)) for m in lanes),
        "lanes": max((int(m.get("most_lanes", 1)) for m in lanes), default=1),
    }


def _membership(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """Joins and leaves over the run: every shard sees every member, so the largest count
    (a shard restarted from a checkpoint counts from there); under a worker range, the rows
    shard 0 dealt: each epoch's, and those trained twice (ps/pieces.py)."""
    counts = [s.get("workers", {}) for s in stats]
    totals: dict[str, Any] = {
        key: max((int(c.get(key, 0)) for c in counts), default=0) for key in ("joins", "leaves")
    }
    pieces = next((s["pieces"] for s in stats if isinstance(s.get("pieces"), dict)), None)
    if pieces is not None:
        totals["epoch_rows"] = pieces.get("epoch_rows", [])
        totals["rows_trained_twice"] = int(pieces.get("rows_trained_twice", 0))
        totals["pieces_reissued"] = int(pieces.get("reissued", 0))
        totals["pieces_per_epoch"] = int(pieces.get("pieces_per_epoch", 0))
    return totals


def _merge_server_stats(stats: list[dict[str, Any]]) -> dict[str, Any]:
    rejected: dict[str, int] = {}
    for shard in stats:
        for reason, count in shard.get("rejected", {}).items():
            rejected[reason] = rejected.get(reason, 0) + count
    return {
        "shards": len(stats),
        "updates": max((s.get("step", 0) for s in stats), default=0),
        "rejected": rejected,
        "events": [e for s in stats for e in s.get("events", [])],
    }
