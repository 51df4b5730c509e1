"""Atomic, verifiable checkpoints: ROOT/step-XXXXXXXX/{state.safetensors,manifest.json}, ROOT/last.

imports: errors, userfile
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.numpy
from safetensors import SafetensorError

from ember.errors import CheckpointError
from ember.userfile import Unreadable, parse_json, read_regular

FORMAT = "ember-checkpoint/1"
# A manifest holds names, shapes and the meta (a clock row per worker): far less than this.
MAX_MANIFEST_BYTES = 64 << 20
STATE = "state.safetensors"
MANIFEST = "manifest.json"
LAST = "last"
_STEP_DIR = re.compile(r"step-(\d{8,})")
_STALE_TMP_SECONDS = 3600.0  # a .tmp-* this old belongs to a crashed save, not a running one


@dataclass(frozen=True)
class Checkpoint:
    """One verified checkpoint; the arrays are fresh buffers owned by the caller."""

    path: Path  # the step-XXXXXXXX directory it was read from
    step: int  # the training step recorded in the manifest
    tensors: dict[str, np.ndarray]  # name -> array, dtype and shape as saved
    meta: dict[str, Any]  # the caller's JSON dict, as saved


def free_step(root: Path | str, step: int) -> int:
    """`step` if it is past every existing name, else one past the highest: names grow with
    time, so a run resumed from an older checkpoint, or a server restarted from one, never
    collides with the newer ones left behind, and pruning keeps the newest."""
    existing = [
        int(m.group(1)) for p in list_checkpoints(root) if (m := _STEP_DIR.fullmatch(p.name))
    ]
    return max(step, max(existing, default=-1) + 1)


def save_checkpoint(
    root: Path | str,
    step: int,
    tensors: Mapping[str, np.ndarray],
    meta: Mapping[str, Any],
    keep: int = 3,
) -> Path:
    """Write ROOT/step-XXXXXXXX atomically, point ROOT/last at it, prune to `keep` newest."""
    root = Path(root)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"step must be an int >= 0, got {step!r}")
    if keep < 1:
        raise CheckpointError(f"keep must be >= 1, got {keep}")
    name = f"step-{step:08d}"
    final = root / name
    arrays = _contiguous_numeric(tensors)
    # Serialise in memory and write the bytes ourselves: we hash exactly what we write, and every
    # write error reaches us as an OSError (safetensors' own file writer is opaque to us).
    try:
        state = safetensors.numpy.save(arrays)
    except SafetensorError as exc:
        raise CheckpointError(f"checkpoint {final}: cannot serialise tensors ({exc})") from exc
    manifest = {
        "format": FORMAT,
        "step": step,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "files": {STATE: {"sha256": hashlib.sha256(state).hexdigest(), "bytes": len(state)}},
        "tensors": {k: {"dtype": a.dtype.name, "shape": list(a.shape)} for k, a in arrays.items()},
        "meta": dict(meta),
    }
    try:
        manifest_bytes = json.dumps(manifest, indent=2).encode()
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {final}: meta is not JSON-serialisable ({exc})") from exc
    if final.exists():
        raise CheckpointError(f"checkpoint {final} already exists; refusing to overwrite it")

    tag = f"{os.getpid()}-{secrets.token_hex(4)}"
    tmp, last_tmp = root / f".tmp-{name}-{tag}", root / f".tmp-last-{tag}"
    published = False
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        _write_durable(tmp / STATE, state)
        _write_durable(tmp / MANIFEST, manifest_bytes)
        _fsync_dir(tmp)
        # Prepared before publishing, so a full disk fails here with nothing visible yet.
        _write_durable(last_tmp, f"{name}\n".encode())
        os.rename(tmp, final)  # atomic: readers see no step dir or a complete one
        published = True
        _fsync_dir(root)  # the rename must be durable before `last` may name it
        os.replace(last_tmp, root / LAST)
        published = False  # `last` names it now: from here on it is live and never rolled back
        _fsync_dir(root)
    except OSError as exc:
        if published:  # the call fails, so leave no step dir behind that `last` never named
            shutil.rmtree(final, ignore_errors=True)
        raise CheckpointError(f"checkpoint {final}: cannot save ({exc.strerror or exc})") from exc
    finally:
        _discard(tmp)
        _discard(last_tmp)
    _prune(root, keep, current=name)
    return final


def load_checkpoint(path: Path | str) -> Checkpoint:
    """Load and verify a step dir, or the one ROOT/last names when given a root."""
    path = Path(path)
    if (path / LAST).is_file():
        path = path / _read_last(path)
    elif path.is_dir() and not (path / MANIFEST).exists() and not _STEP_DIR.fullmatch(path.name):
        raise CheckpointError(f"checkpoint root {path}: no '{LAST}' file (nothing saved here yet)")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path}: no such directory")

    where = path / MANIFEST
    data = _read(where, MAX_MANIFEST_BYTES + 1)
    if len(data) > MAX_MANIFEST_BYTES:
        raise CheckpointError(f"checkpoint {where}: larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        manifest = parse_json(data)  # JSON only, never pickle: this is a user's file
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, and nesting too deep
        raise CheckpointError(f"checkpoint {where}: invalid JSON ({exc})") from exc
    fmt = manifest.get("format") if isinstance(manifest, dict) else None
    if fmt != FORMAT:
        raise CheckpointError(f"checkpoint {where}: format is {fmt!r}, expected {FORMAT!r}")
    try:
        step, meta, entry = manifest["step"], manifest["meta"], manifest["files"][STATE]
        sha256, size = str(entry["sha256"]), entry["bytes"]
        specs = manifest["tensors"].items()
        want = {k: (str(s["dtype"]), tuple(s["shape"])) for k, s in specs}
        if not isinstance(step, int) or not isinstance(meta, dict):
            raise TypeError("'step' must be an int and 'meta' an object")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(
            f"checkpoint {where}: malformed ({type(exc).__name__}: {exc})"
        ) from exc
    # JSON numbers may be floats, 1e30 or Infinity: sizes must be counts, checked before use.
    _check_count(where, f"files.{STATE}.bytes", size)
    for name, (_, shape) in want.items():
        for dim in shape:
            _check_count(where, f"tensors.{name}.shape", dim)

    where = path / STATE
    # Reading at most size + 1 bytes bounds memory for a swapped-in huge file; parsing the very
    # bytes we hashed leaves no window for the file to change between verifying and parsing.
    data = _read(where, size + 1)
    if len(data) != size or hashlib.sha256(data).hexdigest() != sha256:
        raise CheckpointError(f"checkpoint {where}: sha256 mismatch (file is corrupt or truncated)")
    try:
        tensors = safetensors.numpy.load(data)
    except SafetensorError as exc:
        raise CheckpointError(f"checkpoint {where}: not a safetensors file ({exc})") from exc
    got = {k: (a.dtype.name, a.shape) for k, a in tensors.items()}
    for k in sorted(got.keys() | want.keys()):
        if got.get(k) != want.get(k):
            raise CheckpointError(
                f"checkpoint {where}: tensor {k!r} is {got.get(k)}, manifest says {want.get(k)}"
            )
    return Checkpoint(path=path, step=step, tensors=tensors, meta=meta)


def verify_run_state(checkpoint: Checkpoint) -> Checkpoint:
    """Check what a training run reads of a checkpoint, before anything starts from it: the
    flat float32 `params`, rule state of the same shape, and the meta's steps and clocks."""
    where = checkpoint.path / MANIFEST
    params = checkpoint.tensors.get("params")
    if params is None or params.dtype != np.float32 or params.ndim != 1:
        got = "nothing" if params is None else f"{params.dtype.name}{list(params.shape)}"
        raise CheckpointError(f"checkpoint {where}: params must be float32[n], got {got}")
    for name, value in checkpoint.tensors.items():
        if value.dtype != np.float32 or value.shape != params.shape:
            raise CheckpointError(
                f"checkpoint {where}: tensor {name!r} must be float32{list(params.shape)} like "
                f"params, got {value.dtype.name}{list(value.shape)}"
            )
    meta = checkpoint.meta
    for field in ("step", "server_step"):
        if field in meta:
            _check_count(where, f"meta.{field}", meta[field])
    if "config" in meta and not isinstance(meta["config"], dict):
        raise CheckpointError(
            f"checkpoint {where}: meta.config must be an object, got {meta['config']!r}"
        )
    workers = meta.get("workers", {})
    if not isinstance(workers, dict):
        raise CheckpointError(
            f"checkpoint {where}: meta.workers must be an object, got {workers!r}"
        )
    for worker, entry in workers.items():
        field = f"meta.workers[{worker!r}]"
        if not (worker.isdecimal() and worker.isascii()) or not isinstance(entry, dict):
            raise CheckpointError(
                f"checkpoint {where}: {field} must map a worker id to its clocks, got {entry!r}"
            )
        for name in ("clock", "step"):
            _check_count(where, f"{field}.{name}", entry.get(name))
        if not isinstance(entry.get("finished", False), bool):
            raise CheckpointError(
                f"checkpoint {where}: {field}.finished must be true or false, "
                f"got {entry['finished']!r}"
            )
    return checkpoint


def latest_valid_checkpoint(
    root: Path | str, verify: Callable[[Checkpoint], Checkpoint] | None = None
) -> Checkpoint | None:
    """The checkpoint `last` names if it verifies (and passes `verify`), else the newest step
    dir that does, else None."""
    root = Path(root)
    order = list_checkpoints(root)
    try:
        if (root / LAST).is_file():
            named = root / _read_last(root)
            order = [named, *(p for p in order if p != named)]
    except CheckpointError as exc:
        warnings.warn(f"skipping: {exc}", stacklevel=2)
    for candidate in order:
        try:
            loaded = load_checkpoint(candidate)
            return loaded if verify is None else verify(loaded)
        except CheckpointError as exc:
            warnings.warn(f"skipping invalid checkpoint: {exc}", stacklevel=2)
    return None


def list_checkpoints(root: Path | str) -> list[Path]:
    """Step dirs under root, newest (highest step) first; [] if root does not exist."""
    root = Path(root)
    try:
        entries = list(root.iterdir())
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise CheckpointError(f"checkpoint root {root}: {exc.strerror}") from exc
    steps = [(int(m[1]), p) for p in entries if (m := _STEP_DIR.fullmatch(p.name)) and p.is_dir()]
    return [p for _, p in sorted(steps, reverse=True)]


def _contiguous_numeric(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    arrays = {}
    for name, arr in tensors.items():
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise CheckpointError(f"tensor name must be a non-empty string, got {name!r}")
        if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "iuf":
            got = f"dtype {arr.dtype}" if isinstance(arr, np.ndarray) else type(arr).__name__
            raise CheckpointError(f"tensor {name!r} must be a numeric numpy array, got {got}")
        # safetensors copies the raw buffer, so a strided view would be saved scrambled.
        arrays[name] = arr if arr.flags.c_contiguous else arr.copy(order="C")
    return arrays


def _check_count(where: Path, field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CheckpointError(f"checkpoint {where}: {field} must be an integer >= 0, got {value!r}")


def _read(where: Path, limit: int) -> bytes:
    """At most `limit` bytes of a regular file (userfile.read_regular), as a CheckpointError."""
    try:
        return read_regular(where, limit)
    except Unreadable as exc:
        raise CheckpointError(f"checkpoint {where}: {exc}") from None


def _read_last(root: Path) -> str:
    where = root / LAST
    name = _read(where, 256).decode(errors="replace").strip()
    if not _STEP_DIR.fullmatch(name):  # also keeps `last` from pointing outside the root
        raise CheckpointError(f"checkpoint {where}: expected a step-XXXXXXXX name, got {name!r}")
    return name


def _write_durable(path: Path, data: bytes) -> None:
    with open(path, "xb") as f:  # "x": a temp name is ours alone, never someone else's file
        f.write(data)
        f.flush()
        os.fsync(f.fileno())  # else a rename may publish a file whose data never reached disk


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)  # new or renamed entries are durable once their dir is synced
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _prune(root: Path, keep: int, current: str) -> None:
    """Housekeeping after a successful save; failures here never fail that save."""
    with contextlib.suppress(CheckpointError, OSError):
        for old in list_checkpoints(root)[keep:]:
            if old.name != current:
                _discard(old)
        cutoff = time.time() - _STALE_TMP_SECONDS
        for entry in root.glob(".tmp-*"):
            if entry.lstat().st_mtime < cutoff:
                _discard(entry)


def _discard(path: Path) -> None:
    """Best-effort removal of a file or dir tree."""
    with contextlib.suppress(OSError):
        if path.is_symlink() or not path.is_dir():
            path.unlink(missing_ok=True)
            return
        if not path.name.startswith(".tmp-"):
            # Out of the step-* namespace first: a crash mid-delete then leaves a stale .tmp-* for
            # a later prune, never a half-deleted dir that looks like a corrupt checkpoint.
            doomed = path.with_name(f".tmp-pruned-{path.name}-{secrets.token_hex(4)}")
            os.rename(path, doomed)
            path = doomed
        shutil.rmtree(path)


def with_buffers(checkpoint: Checkpoint, initial: np.ndarray, parameters: int) -> Checkpoint:
    """A checkpoint to start `initial`'s model from. One saved before buffers were part of the
    flat state holds vectors of the `parameters` keys alone: its buffers (BatchNorm's
    statistics) are taken from `initial`, with a warning, and a rule's state there is zero.
    Any other size mismatch is a CheckpointError naming both sizes."""
    params = checkpoint.tensors.get("params")
    size = initial.size
    if params is not None and params.shape == (size,):
        return checkpoint
    where = checkpoint.path / MANIFEST
    if params is None or params.size != parameters or "buffers" in checkpoint.meta:
        found = "no params" if params is None else f"{params.size} values"
        raise CheckpointError(
            f"checkpoint {checkpoint.path} holds {found}; the model needs {size}"
            f" ({parameters} parameters and {size - parameters} buffer values)"
        )
    warnings.warn(
        f"checkpoint {where} predates buffers in checkpoints: its {parameters} parameters are"
        f" loaded and the model's {size - parameters} buffer values (BatchNorm statistics)"
        " start from their initial values",
        stacklevel=2,
    )
    tensors = {}
    for name, value in checkpoint.tensors.items():
        grown = initial.copy() if name == "params" else np.zeros(size, np.float32)
        grown[:parameters] = value
        tensors[name] = grown
    return Checkpoint(checkpoint.path, checkpoint.step, tensors, checkpoint.meta)
