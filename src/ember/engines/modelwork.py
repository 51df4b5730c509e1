"""The launcher's torch work: the model's starting parameters and the evaluation of the final
ones. The Spark driver does it in its own process (InProcess). A local run's launcher has it
done by a fork of the workers' fork server (Forked), which has imported torch already, so the
launcher itself never imports torch: seconds of its start, and of its exit, that the fork
server's import of torch overlaps instead."""

from __future__ import annotations

import contextlib
import os
import signal
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgpack
import numpy as np

from ember import errors
from ember.config import RunConfig
from ember.config.objects import NO_OBJECTS, UserObjects
from ember.data import Dataset
from ember.data.store import DataFiles
from ember.engines.phases import PeakMemory, vm_hwm
from ember.engines.process import _die_with_parent, reap
from ember.errors import EmberError

if TYPE_CHECKING:
    import torch

POLL_SECONDS = 0.1  # how often a wait on the child looks whether it is still alive
# Building a model or evaluating it on the test set takes seconds to a few minutes; a child
# still silent after this is hung (a model factory that deadlocks, say), not slow.
ANSWER_SECONDS = 900.0


class ModelWork(Protocol):
    def initial(self, config: RunConfig, dataset: Dataset) -> tuple[np.ndarray, int]:
        """The model's starting state, flat (FlatModel's order: parameters, then buffers),
        from config.seed, and how many of its keys are parameters."""
        ...

    def evaluate(
        self,
        config: RunConfig,
        dataset: Dataset,
        params: np.ndarray,
        export: Path | None,
        score: bool = True,
    ) -> dict[str, float]:
        """The held-out scores (evaluation.Scores) of the model holding `params` on the dataset's
        test rows (none without `score`); with `export`, that module is first written there
        (export.py), so the figures are those of the model a user loads."""
        ...


def fresh_model(
    config: RunConfig, input_shape: tuple[int, ...], num_classes: int, objects: UserObjects
) -> torch.nn.Module:
    """The configured model as config.seed initializes it (already tried on the run's data)."""
    from ember.models import build_model

    source = objects.model_for(config.model)
    return build_model(config.model, input_shape, num_classes, config.seed, None, source)


def fresh_parameters(
    config: RunConfig, dataset: Dataset, objects: UserObjects, tried: bool = True
) -> tuple[np.ndarray, int]:
    """The configured model's starting state, flat (FlatModel's order), and how many of its
    keys are parameters (the rest are buffers); the model and the loss are first tried on the
    dataset's first rows, so a misfit is one error before anything starts (unless not
    `tried`: ember.run's loop brings data of its own, which the run never sees)."""
    from ember.algorithms.flat import flat_layout, flatten_parameters
    from ember.models import build_model
    from ember.models.losses import check_fit, data_probe

    x, y, width = dataset.x_train[:2], dataset.y_train[:2], dataset.num_classes
    probe = data_probe(config.loss, x, y, width) if tried else None
    source = objects.model_for(config.model)
    model = build_model(config.model, dataset.input_shape, width, config.seed, probe, source)
    if tried:
        check_fit(model, config.loss, x, y, objects)
    return flatten_parameters(model), flat_layout(model)[0]


def exported_model(
    config: RunConfig,
    shape: tuple[tuple[int, ...], int],
    params: np.ndarray,
    export: Path | None,
    objects: UserObjects,
) -> torch.nn.Module:
    """The configured model holding `params` (parameters and buffers), in eval mode; written
    to `export` (a run directory) when given."""
    from ember.algorithms import load_flat_parameters

    model = fresh_model(config, shape[0], shape[1], objects)
    load_flat_parameters(model, params)
    model.eval()
    if export is not None:
        from ember.export import save_model

        save_model(export, model, config, shape, objects)
    return model


@dataclass
class InProcess:
    """Torch work in this process (it imports torch the first time)."""

    objects: UserObjects = NO_OBJECTS  # what the run was handed in place of names
    tried: bool = True  # the model is tried on the data's rows (not: a loop brings its own)

    def initial(self, config: RunConfig, dataset: Dataset) -> tuple[np.ndarray, int]:
        return fresh_parameters(config, dataset, self.objects, self.tried)

    def evaluate(
        self,
        config: RunConfig,
        dataset: Dataset,
        params: np.ndarray,
        export: Path | None,
        score: bool = True,
    ) -> dict[str, float]:
        from ember.worker.evaluation import evaluate

        shape = (tuple(dataset.input_shape), dataset.num_classes)
        model = exported_model(config, shape, params, export, self.objects)
        if not score:
            return {}
        x, y = dataset.x_test, dataset.y_test
        return evaluate(model, x, y, config.loss, config.metrics, self.objects)


@dataclass
class Forked:
    """Torch work in a child forked from the workers' fork server (engines/forking.py). The
    child maps the run's data `files` itself; parameters go to it and come back as raw
    float32 bytes on a pipe, its answers as msgpack, never pickle."""

    files: DataFiles
    objects: UserObjects = NO_OBJECTS  # handed to each child as its arguments are
    memory: PeakMemory | None = None  # the run's, to which each child adds its peak
    tried: bool = True  # the model is tried on the data's rows (not: a loop brings its own)

    def initial(self, config: RunConfig, dataset: Dataset) -> tuple[np.ndarray, int]:
        answer = self._ask("initial", config, dataset, None, None)
        parameters = int.from_bytes(answer[:8], "little")
        return np.frombuffer(answer, dtype=np.float32, offset=8).copy(), parameters

    def evaluate(
        self,
        config: RunConfig,
        dataset: Dataset,
        params: np.ndarray,
        export: Path | None,
        score: bool = True,
    ) -> dict[str, float]:
        payload = np.ascontiguousarray(params, dtype=np.float32)  # sent as its buffer: no copy
        answer = self._ask("evaluate" if score else "export", config, dataset, payload, export)
        scores = msgpack.unpackb(answer)
        return {str(k): float(v) for k, v in scores.items()}

    def _ask(
        self,
        kind: str,
        config: RunConfig,
        dataset: Dataset,
        payload: np.ndarray | None,
        export: Path | None,
    ) -> bytes:
        from ember.engines.forking import FORKSERVER

        what = {"initial": "the starting parameters", "export": "the exported model"}.get(
            kind, "the final evaluation"
        )
        ours, theirs = FORKSERVER.Pipe()
        shape = (dataset.input_shape, dataset.num_classes)
        process = FORKSERVER.Process(
            target=_answer,
            args=(
                kind,
                config,
                self.files,
                shape,
                theirs,
                None if export is None else str(export),
                self.objects,
                self.tried,
            ),
            name=f"ember-{kind}",
            daemon=True,
        )
        try:
            process.start()
            theirs.close()
            if payload is not None:
                _send(ours, payload, process, what)
            header = msgpack.unpackb(_receive(ours, process, what))
            if self.memory is not None and header.get("peak") and process.pid is not None:
                self.memory.peaks[process.pid] = int(header["peak"])
            if not header["ok"]:
                raise _error(header, what)
            return _receive(ours, process, what)
        finally:
            ours.close()
            theirs.close()
            if process.pid is not None:  # started
                reap([process])
                with contextlib.suppress(ValueError):  # one that outlived its kill, still
                    process.close()


def _send(conn: Any, payload: np.ndarray, process: Any, what: str) -> None:
    try:
        conn.send_bytes(payload)
    except OSError:  # it stopped reading: failed before it read them (its error is sent), or died
        if conn.poll(0):
            return  # the header that follows says why
        raise _died(process, what) from None


def _receive(conn: Any, process: Any, what: str) -> bytes:
    deadline = time.monotonic() + ANSWER_SECONDS
    while not conn.poll(POLL_SECONDS):
        if process.exitcode is not None and not conn.poll(0):
            raise _died(process, what)
        if time.monotonic() > deadline:  # the caller's finally kills and reaps it
            raise EmberError(
                f"the process working out {what} (pid {process.pid}) did not answer within"
                f" {ANSWER_SECONDS:g}s"
            )
    try:
        return bytes(conn.recv_bytes())
    except (EOFError, OSError):
        raise _died(process, what) from None


def _died(process: Any, what: str) -> EmberError:
    process.join(POLL_SECONDS)
    return EmberError(
        f"the process working out {what} (pid {process.pid}) died with exit code"
        f" {process.exitcode} before it answered"
    )


def _error(header: dict[str, Any], what: str) -> Exception:
    """The child's ember error raised again here as itself; anything else, with its trace."""
    kind = getattr(errors, header["type"], None)
    if isinstance(kind, type) and issubclass(kind, EmberError):
        return kind(header["message"])
    return EmberError(
        f"working out {what} failed: {header['type']}: {header['message']}\n{header['trace']}"
    )


def _answer(
    kind: str,
    config: RunConfig,
    files: DataFiles,
    shape: tuple[Any, int],
    conn: Any,
    export: str | None,
    objects: UserObjects,
    tried: bool,
) -> None:
    """The child: build the model, answer, exit. Ctrl-C is the launcher's to handle."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        input_shape, num_classes = tuple(shape[0]), int(shape[1])
        if kind == "initial":
            values, parameters = fresh_parameters(config, files.dataset(), objects, tried)
            body: Any = parameters.to_bytes(8, "little") + values.tobytes()
        else:
            params = np.frombuffer(conn.recv_bytes(), dtype=np.float32).copy()  # writable
            from ember.worker.evaluation import evaluate_batches

            where = None if export is None else Path(export)
            model = exported_model(config, (input_shape, num_classes), params, where, objects)
            scores = {}
            if kind == "evaluate":  # not "export", which writes the model alone
                # read a window at a time, not mapped: this fork holds no copy of the test set
                batches = files.test_batches(2000)
                scores = evaluate_batches(model, batches, config.loss, config.metrics, objects)
            body = msgpack.packb(scores)
    except Exception as exc:
        failure = {"type": type(exc).__name__, "message": str(exc)}
        conn.send_bytes(msgpack.packb({"ok": False, **failure, "trace": traceback.format_exc()}))
        return
    conn.send_bytes(msgpack.packb({"ok": True, "peak": vm_hwm(os.getpid())}))  # gone soon
    conn.send_bytes(body)
