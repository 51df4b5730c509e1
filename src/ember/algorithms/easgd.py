"""`easgd`: local SGD (optionally Nesterov: EAMSGD) with an elastic exchange every tau steps;
synchronous under BSP, or asynchronous on a background exchanger thread as in DeepSpark."""

from __future__ import annotations

import threading
import time

import numpy as np

from ember.algorithms.base import CommStats, Optimizer, WorkerContext
from ember.algorithms.flat import FlatModel
from ember.algorithms.period import make_period
from ember.errors import EmberError
from ember.ps import PSClient


class _EASGDBase:
    def __init__(self, context: WorkerContext) -> None:
        self.context = context
        self.stats = CommStats()
        self.flat: FlatModel | None = None
        self.optimizer: Optimizer | None = None
        self.elastic = np.empty(0, dtype=np.float32)  # e = alpha * (x_i - center), from the server
        self.steps_done: int | None = None  # local steps taken so far; None before the first
        self.exchanged_at: int | None = None  # local step of the latest exchange
        self.period = make_period(context.strategy)  # when to exchange
        # Worker 0 evaluates the center, the model easgd trains (its own x_0 only trails it),
        # as of its latest exchange: derived from that exchange, so it costs no network.
        self.center: np.ndarray | None = None
        self._keeps_center = context.rank == 0
        self._center_gain = 1 / context.strategy.effective_alpha - 1

    def _keep_center(self, base: np.ndarray) -> None:
        """center = base - e (1/alpha - 1): with base x_i as sent, the center once this
        exchange's e = alpha (x_i - center) moved it; with base x_i - e, the center it met.
        With --compress, e is as decoded and x_i as sent, so the center is within rounding."""
        if not self._keeps_center:
            return
        if self.center is None:
            self.center = np.empty_like(base)
        np.multiply(self.elastic, np.float32(-self._center_gain), out=self.center)
        self.center += base

    def owes_final_exchange(self) -> bool:
        """Whether the center has yet to see this worker's final parameters: it has, unless
        steps were taken since the last exchange (with fewer steps than tau, there was none)."""
        return self.steps_done is not None and self.steps_done != self.exchanged_at

    def _client(self) -> PSClient:
        ctx = self.context
        # x_i travels as its difference from the server's mirror of it
        return ctx.client(differences=True)


class SyncEASGD(_EASGDBase):
    """Every tau steps all workers meet the center: the server answers each with
    e_i = alpha * (x_i - center^t) and commits center += sum_i e_i once the round is complete."""

    client: PSClient

    def start(self, flat: FlatModel, optimizer: Optimizer | None) -> int:
        self.flat, self.optimizer = flat, optimizer
        self.client = self._client()
        resumed = self.client.register()
        buffers = self.client.shared_buffers()
        # in shared memory, the elastic difference is read where the server wrote it
        self.elastic = np.empty(flat.size, np.float32) if buffers is None else buffers[1]
        self.client.pull(flat.params_np)  # x_i starts at the center
        flat.from_host()
        flat.scatter_buffers()
        self.run_step = resumed["run_step"]  # where a joiner's schedule starts
        return resumed["step"]

    def after_backward(self, step: int) -> None:
        assert self.optimizer is not None
        self.optimizer.step()
        self.steps_done = step + 1
        if self.period.exchange_now(step + 1):
            self._exchange(step + 1)

    def _exchange(self, step: int) -> None:
        assert self.flat is not None
        self.client.step = step
        started = time.perf_counter()
        self.flat.gather_buffers()  # buffers move elastically with the parameters
        result = self.client.push(self.flat.to_host(), reply_into=self.elastic)
        self.flat.params_np -= self.elastic  # x_i -= alpha * (x_i - center)
        self.flat.from_host()
        self.flat.scatter_buffers()
        self._keep_center(self.flat.params_np)  # the round's center commits only when complete
        self.stats.record(result, time.perf_counter() - started)
        self.exchanged_at = step

    def finish(self) -> None:
        # A last exchange, so the center holds what this worker learned since its last one.
        # It cannot deadlock a round: the server folds a push once every live worker has
        # reached its clock, and a worker that has left (done) no longer counts.
        if self.owes_final_exchange():
            assert self.steps_done is not None
            self._exchange(self.steps_done)
        self.client.done()
        self.client.close()


class AsyncEASGD(_EASGDBase):
    """The DeepSpark parameter exchanger: every tau steps the main thread hands a snapshot of
    x_i to a background thread and keeps computing; the elastic difference the server returns
    is applied at the first step boundary after it arrives. Compute waits only when the next
    exchange is due while the previous one is still in flight."""

    def start(self, flat: FlatModel, optimizer: Optimizer | None) -> int:
        self.flat, self.optimizer = flat, optimizer
        self._due = threading.Event()  # main -> exchanger: snapshot is ready to send
        self._arrived = threading.Event()  # exchanger -> main: elastic difference is ready
        self._idle = threading.Event()
        self._idle.set()
        self._stop = False
        self._error: BaseException | None = None
        self._resumed: dict[str, int] = {}
        self._blocked = 0.0  # seconds compute waited for the exchange in flight
        self._snapshot_step = 0  # local step at which the snapshot in flight was taken
        self._thread = threading.Thread(
            target=self._exchange_loop, name="ember-exchanger", daemon=True
        )
        self._thread.start()
        # The exchanger owns the socket, so it also registers and pulls the starting center.
        if not self._arrived.wait(self.context.request_timeout + 5):
            raise EmberError("exchanger thread did not start in time")
        self._arrived.clear()
        self._raise_if_failed()
        flat.from_host()  # the exchanger pulled the center into the flat vector
        flat.scatter_buffers()
        self.run_step = self._resumed["run_step"]  # where a joiner's schedule starts
        return self._resumed["step"]

    def _exchange_loop(self) -> None:
        assert self.flat is not None
        try:
            client = self._client()
            self._resumed = client.register()
            client.pull(self.flat.params_np)
            # x_i as sent, and the elastic difference: in shared memory when there is one,
            # so neither is copied on its way
            size = self.flat.size
            self.snapshot, self.elastic = client.shared_buffers() or (
                np.empty(size, np.float32),
                np.empty(size, np.float32),
            )
        except BaseException as exc:  # re-raised on the main thread
            self._error = exc
            self._arrived.set()
            return
        self._arrived.set()
        try:
            while True:
                self._due.wait()
                self._due.clear()
                if self._stop:
                    break
                client.step = self._snapshot_step  # the resume point the servers record
                if self.flat.staged:  # the copy to the host is this thread's, not compute's
                    self.flat.take_over(self.snapshot)
                result = client.push(self.snapshot, reply_into=self.elastic)
                self._last_result = result
                self._arrived.set()
            client.done()
        except BaseException as exc:
            self._error = exc
            self._arrived.set()
            self._idle.set()
        finally:
            client.close()

    def _apply_arrived(self) -> None:
        """x_i -= e for a finished exchange; the exchanger is idle again afterwards."""
        assert self.flat is not None
        if self._arrived.is_set():
            self._arrived.clear()
            self._raise_if_failed()
            # the steps taken since the snapshot stay: only e moves x_i, where it is
            self.flat.subtract(self.elastic)
            self.flat.scatter_buffers()
            self._keep_center(self.snapshot)  # the server moved the center by e at once
            self.stats.record(self._last_result, self._blocked)
            self.period.exchanged(self._last_result.seconds)
            self._idle.set()

    def after_backward(self, step: int) -> None:
        assert self.optimizer is not None
        self.optimizer.step()
        self.steps_done = step + 1
        self._apply_arrived()
        if self.period.exchange_now(step + 1):
            if not self._idle.is_set():  # previous exchange still in flight: compute waits
                started = time.perf_counter()
                if not self._arrived.wait(self.context.request_timeout + 5):
                    raise EmberError(f"worker {self.context.rank}: exchange did not finish")
                self._blocked = time.perf_counter() - started
                self._apply_arrived()
            self._blocked = 0.0
            self._send(step + 1)

    def _send(self, step: int) -> None:
        """Hand the exchanger a snapshot of x_i taken after local step `step`."""
        assert self.flat is not None
        self._idle.clear()
        self.flat.gather_buffers()  # buffers move elastically with the parameters
        if self.flat.staged:
            self.flat.hand_over()  # the exchanger brings it to the host (take_over)
        else:
            np.copyto(self.snapshot, self.flat.params_np)
        self._snapshot_step = self.exchanged_at = step
        self._due.set()

    def finish(self) -> None:
        self._wait_for_exchange("the last exchange")
        if self.owes_final_exchange():  # the center sees this worker's final parameters
            assert self.steps_done is not None
            self._send(self.steps_done)
            self._wait_for_exchange("the final exchange")
        limit = self.context.request_timeout + 5
        self._stop = True
        self._due.set()
        self._thread.join(limit)
        self._raise_if_failed()
        if self._thread.is_alive():
            raise EmberError(
                f"worker {self.context.rank}: the exchanger did not stop within {limit:g}s"
            )

    def _wait_for_exchange(self, what: str) -> None:
        """Wait for the exchange in flight, if any, and apply its elastic difference."""
        limit = self.context.request_timeout + 5
        if not self._idle.is_set():
            if not self._arrived.wait(limit):
                raise EmberError(
                    f"worker {self.context.rank}: {what} did not finish within {limit:g}s"
                )
            self._apply_arrived()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error
