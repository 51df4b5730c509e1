"""MNIST-style IDX files, gzipped or raw, and the vendored MNIST copy (numpy and ember.errors)."""

from __future__ import annotations

import functools
import gzip
import zlib
from pathlib import Path

import numpy as np

from ember.errors import ConfigError

MNIST_DIR = Path(__file__).with_name("mnist")
MNIST_MEAN = 0.1307
MNIST_STD = 0.3081

# split array -> standard IDX file name (without .gz); the names LeCun's site and torchvision use
IDX_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
_IMAGES_MAGIC = 0x00000803  # ubyte, 3 dims (n, rows, cols)
_LABELS_MAGIC = 0x00000801  # ubyte, 1 dim (n,)


def read_idx(path: str | Path, magic: int) -> np.ndarray:
    """Read one ubyte IDX file, gzipped or raw, checking its magic number, dims and length.

    The result is a read-only view of the decompressed bytes (no copy); `magic` is the expected
    first word, 0x00000803 for images or 0x00000801 for labels.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"IDX file {path}: cannot read ({exc.strerror})") from exc
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise ConfigError(f"IDX file {path}: corrupt gzip data ({exc})") from exc
    if len(raw) < 4:
        raise ConfigError(f"IDX file {path}: {len(raw)} bytes is too short for an IDX header")
    found = int.from_bytes(raw[:4], "big")
    if found != magic:
        raise ConfigError(
            f"IDX file {path}: bad magic number 0x{found:08x}, expected 0x{magic:08x}"
            f" ({'images' if magic == _IMAGES_MAGIC else 'labels'}, unsigned bytes)"
        )
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ConfigError(f"IDX file {path}: truncated header ({len(raw)} bytes)")
    dims = tuple(int(d) for d in np.frombuffer(raw, ">u4", count=ndim, offset=4))
    expected = header + int(np.prod(dims, dtype=np.int64))
    if len(raw) != expected:
        shape = "x".join(map(str, dims))
        raise ConfigError(
            f"IDX file {path}: has {len(raw)} bytes, expected {expected} for dims {shape}"
        )
    return np.frombuffer(raw, np.uint8, offset=header).reshape(dims)


def find_idx_files(folder: Path) -> dict[str, Path]:
    """Map each split array to its file in `folder` (raw preferred over .gz); skip absent ones."""
    found = {}
    for key, name in IDX_FILES.items():
        for candidate in (folder / name, folder / f"{name}.gz"):
            if candidate.is_file():
                found[key] = candidate
                break
    return found


def load_idx_folder(folder: str | Path) -> dict[str, np.ndarray]:
    """The four IDX arrays of `folder` as uint8: images (n, rows, cols) and labels (n,).

    Parsed once per process and cached; the arrays are shared and read-only, so callers convert
    (normalize_images, astype) rather than write to them.
    """
    folder = Path(folder).resolve()
    files = find_idx_files(folder)
    missing = [f"{IDX_FILES[k]}[.gz]" for k in IDX_FILES if k not in files]
    if missing:
        raise ConfigError(f"IDX folder {folder}: missing {', '.join(missing)}")
    # the stat stamp makes a rewritten file miss the cache instead of returning stale arrays
    stamp = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in files.values())
    return dict(_load_cached(stamp))


def normalize_images(images: np.ndarray) -> np.ndarray:
    """uint8 images (n, rows, cols) -> new float32 (n, 1, rows, cols), (x / 255 - mean) / std."""
    x = images.astype(np.float32)
    # the division by 255 and the normalization folded into one scale and one shift, in place
    x *= np.float32(1.0 / (255.0 * MNIST_STD))
    x -= np.float32(MNIST_MEAN / MNIST_STD)
    return x.reshape(len(images), 1, *images.shape[1:])


@functools.lru_cache(maxsize=4)
def _load_cached(stamp: tuple[tuple[str, int, int], ...]) -> dict[str, np.ndarray]:
    paths = dict(zip(IDX_FILES, (Path(s[0]) for s in stamp), strict=True))
    arrays = {
        key: read_idx(path, _IMAGES_MAGIC if key[0] == "x" else _LABELS_MAGIC)
        for key, path in paths.items()
    }
    for split in ("train", "test"):
        images, labels = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if len(images) != len(labels):
            raise ConfigError(
                f"IDX file {paths[f'y_{split}']}: has {len(labels)} labels but"
                f" {paths[f'x_{split}'].name} has {len(images)} images"
            )
        if len(images) == 0:
            raise ConfigError(f"IDX file {paths[f'x_{split}']}: has no images")
    return arrays
