"""Checkpoints: round trip, `last`, pruning, corruption detection and crash safety."""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from ember import checkpoint
from ember.checkpoint import (
    FORMAT,
    Checkpoint,
    free_step,
    latest_valid_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from ember.errors import CheckpointError

pytestmark = pytest.mark.timeout(30)


def _state(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "params": rng.standard_normal(1000).astype(np.float32),
        "momentum": rng.standard_normal(1000).astype(np.float32),
        "clocks": np.arange(4, dtype=np.int64) + seed,
    }


def _assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for name, arr in want.items():
        assert got[name].dtype == arr.dtype, name
        assert got[name].shape == arr.shape, name
        np.testing.assert_array_equal(got[name], arr)


def test_round_trip_keeps_values_dtypes_shapes_step_and_meta(tmp_path: Path) -> None:
    tensors = {
        **_state(1),
        "matrix": np.arange(12, dtype=np.float64).reshape(3, 4).T,  # a strided, transposed view
        "scalar": np.array(7, dtype=np.int32),
        "big_endian": np.arange(5, dtype=">f4"),
        "empty": np.zeros((0, 3), dtype=np.uint8),
    }
    meta = {"model": {"name": "mlp", "hidden": [64, 32]}, "strategy": "easgd", "lr": 0.1}

    path = save_checkpoint(tmp_path, 1234, tensors, meta)
    ckpt = load_checkpoint(path)

    assert path == tmp_path / "step-00001234"
    assert isinstance(ckpt, Checkpoint)
    assert (ckpt.path, ckpt.step, ckpt.meta) == (path, 1234, meta)
    want = {k: np.asarray(v, dtype=v.dtype.newbyteorder("=")) for k, v in tensors.items()}
    _assert_same(ckpt.tensors, want)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["format"] == FORMAT == "ember-checkpoint/1"
    assert manifest["tensors"]["matrix"] == {"dtype": "float64", "shape": [4, 3]}
    assert (
        manifest["files"]["state.safetensors"]["bytes"]
        == (path / "state.safetensors").stat().st_size
    )


def test_last_names_the_newest_checkpoint_and_loading_the_root_follows_it(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        save_checkpoint(tmp_path, step, _state(step), {"step": step})

    assert (tmp_path / "last").read_text() == "step-00000030\n"
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.step == 30
    _assert_same(ckpt.tensors, _state(30))
    assert list_checkpoints(tmp_path) == [tmp_path / f"step-{s:08d}" for s in (30, 20, 10)]


def test_pruning_keeps_only_the_keep_newest_checkpoints(tmp_path: Path) -> None:
    for step in range(1, 7):
        save_checkpoint(tmp_path, step, _state(step), {}, keep=2)

    assert list_checkpoints(tmp_path) == [tmp_path / "step-00000006", tmp_path / "step-00000005"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last", "step-00000005", "step-00000006"]


def test_pruning_never_removes_the_checkpoint_last_names(tmp_path: Path) -> None:
    for step in (10, 20):
        save_checkpoint(tmp_path, step, _state(step), {}, keep=2)
    save_checkpoint(tmp_path, 5, _state(5), {}, keep=2)  # e.g. a resumed run saving a lower step

    assert load_checkpoint(tmp_path).step == 5
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "step-00000020",
        "step-00000010",
        "step-00000005",
    ]


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-7])


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_truncate, _flip_a_byte])
def test_a_damaged_state_file_gives_the_sha256_error_naming_it(tmp_path: Path, damage) -> None:
    path = save_checkpoint(tmp_path, 3, _state(3), {})
    damage(path / "state.safetensors")

    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(info.value) == (
        f"checkpoint {path}/state.safetensors: sha256 mismatch (file is corrupt or truncated)"
    )


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ('{"format": "ember-checkpoint/1", "step": ', "invalid JSON ("),
        ('{"format": "ember-checkpoint/0", "step": 3}', "format is 'ember-checkpoint/0', expected"),
        ("[1, 2, 3]", "format is None, expected 'ember-checkpoint/1'"),
        ('{"format": "ember-checkpoint/1", "step": 3}', "malformed (KeyError: 'meta')"),
        (None, "missing"),
    ],
)
def test_a_bad_manifest_gives_an_error_naming_it_and_the_reason(
    tmp_path: Path, content: str | None, reason: str
) -> None:
    path = save_checkpoint(tmp_path, 3, _state(3), {})
    manifest = path / "manifest.json"
    if content is None:
        manifest.unlink()
    else:
        manifest.write_text(content)

    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(info.value).startswith(f"checkpoint {manifest}: {reason}")


def test_a_tensor_disagreeing_with_the_manifest_is_rejected(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, 3, _state(3), {})
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["tensors"]["clocks"]["shape"] = [5]
    (path / "manifest.json").write_text(json.dumps(manifest))

    with pytest.raises(CheckpointError, match=r"tensor 'clocks' is \('int64', \(4,\)\), manifest"):
        load_checkpoint(path)


def test_latest_valid_checkpoint_falls_back_to_the_previous_good_one(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, _state(step), {"step": step})
    _flip_a_byte(tmp_path / "step-00000003" / "state.safetensors")

    with pytest.warns(UserWarning, match=r"step-00000003/state\.safetensors: sha256 mismatch"):
        ckpt = latest_valid_checkpoint(tmp_path)

    assert ckpt is not None
    assert ckpt.step == 2
    _assert_same(ckpt.tensors, _state(2))


def test_latest_valid_checkpoint_survives_a_missing_or_bogus_last(tmp_path: Path) -> None:
    for step in (1, 2):
        save_checkpoint(tmp_path, step, _state(step), {})
    (tmp_path / "last").write_text("../../etc\n")

    with pytest.warns(UserWarning, match="expected a step-XXXXXXXX name, got '../../etc'"):
        ckpt = latest_valid_checkpoint(tmp_path)
    assert ckpt is not None and ckpt.step == 2
    with pytest.raises(CheckpointError, match=r"last: expected a step-XXXXXXXX name"):
        load_checkpoint(tmp_path)

    (tmp_path / "last").unlink()
    assert latest_valid_checkpoint(tmp_path).step == 2  # type: ignore[union-attr]


def test_saving_an_existing_step_raises_and_leaves_the_old_checkpoint_intact(
    tmp_path: Path,
) -> None:
    path = save_checkpoint(tmp_path, 7, _state(7), {"run": "first"})
    before = {p.name: p.read_bytes() for p in path.iterdir()}

    with pytest.raises(CheckpointError) as info:
        save_checkpoint(tmp_path, 7, _state(99), {"run": "second"})

    assert str(info.value) == f"checkpoint {path} already exists; refusing to overwrite it"
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before
    assert load_checkpoint(tmp_path).meta == {"run": "first"}


def _fail_on_call(monkeypatch: pytest.MonkeyPatch, name: str, n: int) -> None:
    """Make the n-th call of os.<name> raise ENOSPC, as a full disk would."""
    real, calls = getattr(os, name), []

    def failing(*args, **kwargs):
        calls.append(args)
        if len(calls) == n:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(os, name, failing)


# fsyncs in a save: state, manifest, tmp dir, last's temp, root after rename, root after replace
@pytest.mark.parametrize(
    ("name", "n"),
    [("rename", 1), ("fsync", 1), ("fsync", 2), ("fsync", 3), ("fsync", 4), ("fsync", 5)],
)
def test_a_write_failing_midway_leaves_last_and_the_previous_checkpoint_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, n: int
) -> None:
    save_checkpoint(tmp_path, 1, _state(1), {"step": 1})
    _fail_on_call(monkeypatch, name, n)

    with pytest.raises(CheckpointError) as info:
        save_checkpoint(tmp_path, 2, _state(2), {"step": 2})
    monkeypatch.undo()

    assert str(info.value) == (
        f"checkpoint {tmp_path}/step-00000002: cannot save (No space left on device)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last", "step-00000001"]
    assert (tmp_path / "last").read_text() == "step-00000001\n"
    ckpt = load_checkpoint(tmp_path)
    assert (ckpt.step, ckpt.meta) == (1, {"step": 1})
    _assert_same(ckpt.tensors, _state(1))
    save_checkpoint(tmp_path, 2, _state(2), {"step": 2})  # the step is free to retry


def test_a_checkpoint_with_a_different_tensor_set_still_loads(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 1, _state(1), {})
    other = {"weights": np.ones((2, 2), dtype=np.float32)}
    save_checkpoint(tmp_path, 2, other, {"model": "other"})

    ckpt = latest_valid_checkpoint(tmp_path)
    assert ckpt is not None
    _assert_same(ckpt.tensors, other)


def test_an_empty_or_missing_root_has_no_checkpoint(tmp_path: Path) -> None:
    assert latest_valid_checkpoint(tmp_path) is None
    assert latest_valid_checkpoint(tmp_path / "nope") is None
    assert list_checkpoints(tmp_path / "nope") == []
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path)
    assert str(info.value) == f"checkpoint root {tmp_path}: no 'last' file (nothing saved here yet)"


@pytest.mark.parametrize(
    ("value", "got"),
    [
        ([1.0, 2.0], "list"),
        (np.array(["a", "b"]), "dtype <U1"),
        (np.array([True]), "dtype bool"),
        (np.array([None]), "dtype object"),
    ],
)
def test_a_tensor_that_is_not_a_numeric_array_is_rejected_before_anything_is_written(
    tmp_path: Path, value: object, got: str
) -> None:
    with pytest.raises(CheckpointError) as info:
        save_checkpoint(tmp_path / "ck", 1, {"params": value}, {})  # type: ignore[dict-item]
    assert str(info.value) == f"tensor 'params' must be a numeric numpy array, got {got}"
    assert not (tmp_path / "ck").exists()


def test_meta_that_is_not_json_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="meta is not JSON-serialisable"):
        save_checkpoint(tmp_path, 1, _state(1), {"fn": print})
    assert list(tmp_path.iterdir()) == []


def test_stale_tmp_dirs_are_removed_after_an_hour_and_fresh_ones_kept(tmp_path: Path) -> None:
    stale, fresh = tmp_path / ".tmp-step-00000009-1-aa", tmp_path / ".tmp-step-00000009-2-bb"
    for d in (stale, fresh):
        d.mkdir()
        (d / "state.safetensors").write_bytes(b"partial")
    hour_ago = time.time() - checkpoint._STALE_TMP_SECONDS - 60
    os.utime(stale, (hour_ago, hour_ago))

    save_checkpoint(tmp_path, 1, _state(1), {})

    assert not stale.exists()
    assert fresh.exists()


def test_evaluate_never_imports_a_model_factory_named_only_by_the_checkpoint(tmp_path) -> None:
    from ember.api import evaluate_checkpoint
    from ember.errors import ConfigError

    path = save_checkpoint(
        tmp_path,
        1,
        {"params": np.zeros(3, np.float32)},
        {"config": {"model": "os:abort", "data": "digits"}},
    )
    with pytest.raises(ConfigError, match="trained with model factory 'os:abort'; pass --model"):
        evaluate_checkpoint(path)


def test_free_step_names_grow_with_time_even_after_a_fall_back(tmp_path: Path) -> None:
    assert free_step(tmp_path, 5) == 5
    save_checkpoint(tmp_path, 10, _state(10), {})
    save_checkpoint(tmp_path, 20, _state(20), {})
    assert free_step(tmp_path, 30) == 30
    assert free_step(tmp_path, 20) == 21  # taken
    assert free_step(tmp_path, 15) == 21  # free, but older than step-00000020


def _run_checkpoint(root: Path, **tensors: np.ndarray) -> Path:
    """A checkpoint as a run's servers save it: flat params and momentum, steps and clocks."""
    config = {"model": "logreg", "data": "digits", "strategy": "async", "lr": 0.1}
    meta = {
        "step": 3,
        "server_step": 3,
        "config": config,
        "workers": {"0": {"clock": 1, "step": 3, "finished": False, "incarnation": 0}},
    }
    flat = np.zeros(1000, np.float32)
    return save_checkpoint(root, 3, {"params": flat, "momentum": flat, **tensors}, meta)


def _edit(field: str, value: object) -> object:
    def damage(path: Path) -> None:
        manifest = json.loads((path / "manifest.json").read_text())
        *parents, last = field.split(".")
        node = manifest
        for key in parents:
            node = node[key.replace("/", ".")]
        node[last] = value
        (path / "manifest.json").write_text(json.dumps(manifest))

    return damage


def _resave(**tensors: np.ndarray) -> object:
    def damage(path: Path) -> None:
        _discard = checkpoint._discard
        _discard(path)
        _run_checkpoint(path.parent, **tensors)

    return damage


def _fifo(name: str) -> object:
    def damage(path: Path) -> None:
        (path / name).unlink()
        os.mkfifo(path / name)

    return damage


def _nest(field: str, depth: int) -> object:
    """A manifest whose `field` is JSON nested `depth` lists deep."""

    def damage(path: Path) -> None:
        text = (path / "manifest.json").read_text()
        nested = "[" * depth + "]" * depth
        text = text.replace(f'"{field}": ', f'"{field}": {nested}, "x": ', 1)
        (path / "manifest.json").write_text(text)

    return damage


RUN_DAMAGES = [
    (
        _edit("files.state/safetensors.bytes", float("inf")),
        "m",
        "files.state.safetensors.bytes must be an integer >= 0, got inf",
    ),
    (
        _edit("files.state/safetensors.bytes", 1e30),
        "m",
        "files.state.safetensors.bytes must be an integer >= 0, got 1e+30",
    ),
    (
        _edit("tensors.params.shape", [float("inf")]),
        "m",
        "tensors.params.shape must be an integer >= 0, got inf",
    ),
    (
        _resave(params=np.zeros((10, 100), np.float32)),
        "m",
        "params must be float32[n], got float32[10, 100]",
    ),
    (
        _resave(momentum=np.zeros(999, np.float32)),
        "m",
        "tensor 'momentum' must be float32[1000] like params, got float32[999]",
    ),
    (_edit("meta.config", 5), "m", "meta.config must be an object, got 5"),
    (_edit("meta.step", "3"), "m", "meta.step must be an integer >= 0, got '3'"),
    (_edit("meta.server_step", "3"), "m", "meta.server_step must be an integer >= 0, got '3'"),
    (_edit("meta.workers", [1]), "m", "meta.workers must be an object, got [1]"),
    (
        _edit("meta.workers.0", 5),
        "m",
        "meta.workers['0'] must map a worker id to its clocks, got 5",
    ),
    (
        _edit("meta.workers.0.clock", "1"),
        "m",
        "meta.workers['0'].clock must be an integer >= 0, got '1'",
    ),
    (
        _edit("meta.workers.0.finished", "no"),
        "m",
        "meta.workers['0'].finished must be true or false, got 'no'",
    ),
    (_fifo("state.safetensors"), "s", "not a regular file"),
    *(
        (
            _edit("files.state/safetensors.bytes", size),
            "s",
            "sha256 mismatch (file is corrupt or truncated)",
        )
        for size in (1 << 40, 1 << 62, 1 << 63, 10**30)
    ),
    (_nest("meta", 100_000), "m", "invalid JSON (nested too deeply)"),
    (_fifo("manifest.json"), "m", "not a regular file"),
]


@pytest.mark.parametrize("entry", ["evaluate", "resume"])
@pytest.mark.parametrize(("damage", "file", "message"), RUN_DAMAGES)
def test_a_damaged_run_checkpoint_is_one_error_naming_the_file_and_the_field(
    tmp_path: Path, entry: str, damage, file: str, message: str
) -> None:
    from ember.api import evaluate_checkpoint, run_config

    path = _run_checkpoint(tmp_path / "run" / "checkpoints")
    damage(path)
    name = {"m": "manifest.json", "s": "state.safetensors"}[file]
    with pytest.raises(CheckpointError) as info:
        if entry == "evaluate":
            evaluate_checkpoint(path)
        else:
            run_config({"resume": str(path), "out": str(tmp_path / "run")})
    assert str(info.value) == f"checkpoint {path / name}: {message}"


@pytest.mark.parametrize("entry", ["evaluate", "resume"])
def test_a_saved_config_with_a_field_of_the_wrong_type_is_a_checkpoint_error(
    tmp_path: Path, entry: str
) -> None:
    from ember.api import evaluate_checkpoint, run_config

    path = _run_checkpoint(tmp_path / "run" / "checkpoints")
    _edit("meta.config.data", 5)(path)
    with pytest.raises(CheckpointError) as info:
        if entry == "evaluate":
            evaluate_checkpoint(path)
        else:
            run_config({"resume": str(path), "out": str(tmp_path / "run")})
    where = path / "manifest.json" if entry == "evaluate" else path
    invalid = (
        "meta.config is invalid" if entry == "evaluate" else "its manifest's config is invalid"
    )
    assert str(info.value) == f"checkpoint {where}: {invalid}: data must be str, got 5"


def test_resume_auto_with_every_checkpoint_corrupt_says_so_naming_them(tmp_path: Path) -> None:
    from ember.api import run_config

    root = tmp_path / "run" / "checkpoints"
    first = _run_checkpoint(root)
    _edit("meta.step", "3")(first)
    second = save_checkpoint(root, 4, {"params": np.zeros(5, np.float32)}, {"step": "x"})
    with pytest.raises(CheckpointError) as info:
        run_config({"resume": "auto", "out": str(tmp_path / "run")})
    assert str(info.value) == (
        f"--resume auto: every checkpoint in {root} is corrupt ({second.name}, {first.name});"
        " pass --resume PATH to see why, or choose another --out"
    )


def test_resume_auto_falls_back_past_a_checkpoint_whose_manifest_claims_a_huge_file(
    tmp_path: Path,
) -> None:
    from ember.api import run_config

    root = tmp_path / "run" / "checkpoints"
    older = _run_checkpoint(root)
    newer = save_checkpoint(root, 4, {"params": np.zeros(1000, np.float32)}, {"step": 4})
    _edit("files.state/safetensors.bytes", 1 << 62)(newer)
    with pytest.warns(UserWarning, match="state.safetensors: sha256 mismatch"):
        found = checkpoint.latest_valid_checkpoint(root, checkpoint.verify_run_state)
    assert found is not None and found.path == older
    config = run_config({"resume": "auto", "out": str(tmp_path / "run")})
    assert (config.strategy, config.lr) == ("async", 0.1)  # the older checkpoint's
