"""`diloco --fragments F` (Streaming DiLoCo, Douillard et al. 2025): the parameters in F
fragments, each synced every tau steps at staggered steps on a background exchanger thread
while the worker computes, and merged a stagger later."""

from __future__ import annotations

import threading
import time

import numpy as np

from ember.algorithms.base import CommStats, Optimizer, WorkerContext
from ember.algorithms.flat import FlatModel
from ember.errors import EmberError
from ember.ps import ExchangeResult, PSClient


def lerp(start: np.ndarray, end: np.ndarray, weight: float, out: np.ndarray) -> np.ndarray:
    """out = start + weight (end - start), torch.lerp's arithmetic, as torchft mixes a worker's
    parameters (end) with the global ones (start); out may be end, never start."""
    np.subtract(end, start, out=out)
    np.multiply(out, np.float32(weight), out=out)
    return np.add(out, start, out=out)


class StreamingDiLoCo:
    """Fragment f is the keys of servers [f S/F, (f+1) S/F), with a client of its own, so the
    servers' BSP rounds are per fragment and need nothing new. With stagger = tau / F, the
    n-th sync is fragment (n - 1) mod F's: its pseudo-gradient start_f - x_f is pushed with a
    pull, compute goes on, and the result is merged d = --fragment-sync-delay steps later. By
    default d is the stagger: pushed after local step n * stagger, merged after (n + 1) *
    stagger. Below it (torchft's fragment_sync_delay): pushed after step n * stagger - d,
    merged after n * stagger.

    The mixing rule, applied at that fixed step (waiting there if the exchange is not back,
    so the result does not depend on thread timing): x_f = g_f + (x_f - s_f), with g_f the
    new global fragment and s_f the worker's fragment as sent. The local steps
    taken while the exchange was in flight are kept on top of the global parameters rather
    than averaged with them (Streaming DiLoCo's alpha mixing): none of the worker's work is
    dropped, the next pseudo-gradient, counted from start_f = g_f, holds those steps once,
    and an exchange that comes back before the next step is plain DiLoCo.

    With --mixing-alpha the merge is torchft's instead, x_f = g_f + alpha (x_f - g_f): 0
    takes the global fragment and drops the in-flight steps, 1 keeps the local one."""

    def __init__(self, context: WorkerContext) -> None:
        strategy = context.strategy  # a fixed tau: config refuses --tau auto with --fragments
        self.context, self.stats = context, CommStats()
        self.count, self.stagger = strategy.fragments, strategy.tau // strategy.fragments
        self.mixing_alpha = strategy.mixing_alpha  # None: ember's rule, x_f = g_f + (x_f - s_f)
        delay = strategy.fragment_sync_delay  # steps from a push to its merge
        self.delay = self.stagger if delay is None else delay
        self.flat: FlatModel | None = None
        self.optimizer: Optimizer | None = None
        self.keys: list[slice] = []  # each fragment's keys
        self.synced_at: list[int] = []  # the step each fragment was last pushed at
        self.start_params = np.empty(0, np.float32)  # each fragment's global, as last merged
        self.pulled = np.empty(0, np.float32)  # the exchanger's: as the servers last sent them
        self.delta = np.empty(0, np.float32)  # what is pushed; scratch at a merge
        self.sent = np.empty(0, np.float32)  # s_f: the fragment as pushed
        self.steps_done: int | None = None
        self.merged = False  # a fragment came back into the parameters
        self._job: tuple[int, int, bool] | None = None  # (fragment, step, pull) in flight
        self._result: ExchangeResult | None = None
        self._error: BaseException | None = None
        self._stop = False
        self._due, self._arrived = threading.Event(), threading.Event()
        self._thread = threading.Thread(
            target=self._exchange_loop, name="ember-exchanger", daemon=True
        )
        self._limit = context.request_timeout + 5

    @property
    def center(self) -> np.ndarray | None:
        """Worker 0 evaluates the global fragments as of their latest merges."""
        return self.start_params if self.context.rank == 0 and self.merged else None

    def start(self, flat: FlatModel, optimizer: Optimizer | None) -> int:
        if flat.staged:  # its exchanger reads and writes fragments of a vector compute uses
            raise EmberError(
                f"diloco with --fragments {self.count} trains on the CPU only; this worker's"
                f" model is on {flat.device} (use --device cpu, or --fragments 1)"
            )
        self.flat, self.optimizer = flat, optimizer
        # The exchanger owns the clients: it registers each fragment's and pulls its keys.
        self._thread.start()
        self._wait("registration")
        flat.scatter_buffers()
        self.start_params = flat.params_np.copy()
        self.delta, self.sent = np.empty_like(self.start_params), np.empty_like(self.start_params)
        # A restarted worker goes on from the fragment synced longest ago; the others skip
        # the syncs the servers already hold.
        return min(self.synced_at)

    def _exchange_loop(self) -> None:
        assert self.flat is not None
        ctx, per = self.context, len(self.context.servers) // self.count
        clients: list[PSClient] = []
        try:
            for fragment in range(self.count):
                client = ctx.client(ctx.servers[fragment * per : (fragment + 1) * per])
                clients.append(client)
                self.synced_at.append(client.register()["step"])
                client.pull(self.flat.params_np)  # the fragment's keys only
                self.keys.append(slice(client.ranges[0][0], client.ranges[-1][1]))
            self.pulled = self.flat.params_np.copy()
            self._arrived.set()
            while True:
                self._due.wait()
                self._due.clear()
                if self._stop:
                    break
                assert self._job is not None
                fragment, step, pull = self._job
                client = clients[fragment]
                client.step = step
                self._result = client.push(self.delta, self.pulled if pull else None, pull=pull)
                self._arrived.set()
            for client in clients:
                client.done()
        except BaseException as exc:  # re-raised on the main thread
            self._error = exc
            self._arrived.set()
        finally:
            for client in clients:
                client.close()

    def after_backward(self, step: int) -> None:
        assert self.optimizer is not None
        self.optimizer.step()
        self.steps_done = done = step + 1
        if done % self.stagger == 0:
            self._merge()  # pushed `delay` steps ago
        if (done + self.delay) % self.stagger == 0:
            fragment = (done - 1) // self.stagger % self.count
            if done > self.synced_at[fragment]:
                self._send(fragment, done, pull=True)
                if self.delay == 0:  # the step the sync is pushed after is also its merge's
                    self._merge()

    def _send(self, fragment: int, step: int, pull: bool) -> None:
        """Hand the exchanger fragment `fragment`'s pseudo-gradient after local step `step`."""
        assert self.flat is not None
        keys, params = self.keys[fragment], self.flat.params_np
        self.flat.gather_buffers()
        np.subtract(self.start_params[keys], params[keys], out=self.delta[keys])
        np.copyto(self.sent[keys], params[keys])
        self.synced_at[fragment] = step
        self._job = (fragment, step, pull)
        self._arrived.clear()
        self._due.set()

    def _merge(self) -> None:
        """Apply the exchange in flight, if any, waiting for it: x_f = g_f + (x_f - s_f), or
        with --mixing-alpha x_f = g_f + alpha (x_f - g_f)."""
        if self._job is None:
            return
        assert self.flat is not None
        started = time.perf_counter()
        self._wait("an exchange")
        fragment, _, pull = self._job
        if pull:
            keys, params = self.keys[fragment], self.flat.params_np
            self.flat.gather_buffers()  # a buffer of another dtype moved since it was sent
            if self.mixing_alpha is None:
                np.subtract(self.pulled[keys], self.sent[keys], out=self.delta[keys])
                params[keys] += self.delta[keys]
            else:
                lerp(self.pulled[keys], params[keys], self.mixing_alpha, out=params[keys])
            np.copyto(self.start_params[keys], self.pulled[keys])
            self.flat.scatter_buffers()
            self.merged = True
        assert self._result is not None
        self.stats.record(self._result, time.perf_counter() - started)
        self._job = None

    def _wait(self, what: str) -> None:
        if not self._arrived.wait(self._limit):
            raise EmberError(f"worker {self.context.rank}: {what} did not finish in time")
        if self._error is not None:
            raise self._error

    def finish(self) -> None:
        self._merge()
        # Every fragment's steps since its last sync reach the servers (no round to wait for).
        for fragment in range(self.count):
            if self.steps_done is not None and self.steps_done > self.synced_at[fragment]:
                self._send(fragment, self.steps_done, pull=False)
                self._merge()
        self._stop = True
        self._due.set()
        self._thread.join(self._limit)
        if self._error is not None:
            raise self._error
        if self._thread.is_alive():
            raise EmberError(
                f"worker {self.context.rank}: the exchanger did not stop within {self._limit:g}s"
            )
