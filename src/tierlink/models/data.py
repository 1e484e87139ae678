"""Labelled data, one type for every model: :class:`Labelled` (inputs by name, labels) and
:class:`Splits` (calibration and test parts, and the training part where a model was
trained here).

A zoo task's data comes from its source (``tierlink.zoo.datasets``); a user's model's data
from an ``.npz`` (``x``, ``y``; a multi-input model's inputs under their own names) or a
folder of ``.npy`` files (one sample each) with a ``labels.csv`` (``file,label``)
(:func:`load_data`), split once, seeded, into a calibration part (temperature, thresholds)
and a test part (the figures a card reports) (:func:`split`).
"""

from __future__ import annotations

import csv
import hashlib
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np

from tierlink.errors import ImportRefused, ModelError

LABELS_CSV = "labels.csv"


@dataclass(frozen=True, slots=True)
class Labelled:
    """Inputs by input name, (N, ...) each, and their labels (N, ...): class ids, 0/1 per
    label, boxes or values, as the task's output kind reads them. ``sha256``: of the data as
    loaded (inputs, then labels), naming which data a card was measured on ("" where the
    data's source names it instead)."""

    inputs: Mapping[str, np.ndarray]
    labels: np.ndarray
    sha256: str = ""

    @classmethod
    def of(cls, x: np.ndarray, labels: np.ndarray, name: str = "input") -> Labelled:
        """Data of a model with one input."""
        return cls(MappingProxyType({name: x}), labels)

    @property
    def input(self) -> np.ndarray:
        """The only input's array, e.g. images (N, 1, 28, 28)."""
        if len(self.inputs) != 1:
            raise ModelError(f"the data feeds {len(self.inputs)} inputs {sorted(self.inputs)}, "
                             "not one", hint="name the input: data.inputs[NAME]")
        return next(iter(self.inputs.values()))

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def take(self, rows: np.ndarray) -> Labelled:
        """The samples at ``rows``, in that order."""
        return Labelled(MappingProxyType({k: v[rows] for k, v in self.inputs.items()}),
                        self.labels[rows], self.sha256)

    def head(self, n: int) -> Labelled:
        """The first ``n`` samples (all of them when ``n`` is larger)."""
        return Labelled(MappingProxyType({k: v[:n] for k, v in self.inputs.items()}),
                        self.labels[:n], self.sha256 if n >= len(self) else "")


EMPTY = Labelled(MappingProxyType({}), np.zeros(0, np.int64))


@dataclass(frozen=True, slots=True)
class Splits:
    """A model's data in parts: ``calib`` (held out of training: temperature, thresholds,
    INT8 calibration), ``test`` (every figure a card reports) and ``train`` (where it was
    trained here; empty for an imported model). ``seed``: the split's, for data split by
    :func:`split`."""

    calib: Labelled
    test: Labelled
    train: Labelled = EMPTY
    class_names: tuple[str, ...] = ()
    seed: int = 0


def load_data(path: Path, input_names: Sequence[str], labels: Sequence[str] = ()) -> Labelled:
    """Read ``path`` for a model whose inputs are ``input_names``; refuse what cannot be
    used, naming the problem. ``labels``: class names a labels CSV may use instead of ids."""
    path = Path(path)
    if path.is_dir():
        x, y = _folder(path, input_names, labels)
    elif path.suffix == ".npz" and path.is_file():
        x, y = _npz(path, input_names)
    else:
        raise ImportRefused(f"--data {path}: not an .npz file or a folder of .npy files",
                            hint="give data.npz with arrays x and y, or a folder of .npy "
                                 f"samples with a {LABELS_CSV} (file,label)")
    if len(y) == 0:
        raise ImportRefused(f"--data {path} holds no samples")
    for name, arr in x.items():
        if len(arr) != len(y):
            raise ImportRefused(f"--data {path}: input {name!r} has {len(arr)} samples but "
                                f"there are {len(y)} labels", hint="one label per sample")
    return Labelled(MappingProxyType(x), y, _digest(x, y))


def split(data: Labelled, calib_share: float = 0.5, seed: int = 0) -> Splits:
    """A seeded random split; each part keeps at least one sample."""
    if len(data) < 2:
        raise ImportRefused(f"the data has {len(data)} sample(s); at least 2 are needed "
                            "(a calibration part and an evaluation part)")
    if not 0.0 < calib_share < 1.0:
        raise ImportRefused(f"--calib-share must be in (0, 1), got {calib_share}")
    order = np.random.default_rng(seed).permutation(len(data))
    cut = min(max(1, round(calib_share * len(data))), len(data) - 1)
    return Splits(data.take(np.sort(order[:cut])), data.take(np.sort(order[cut:])), seed=seed)


def _npz(path: Path, input_names: Sequence[str]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise ImportRefused(f"--data {path} is not a readable .npz: {exc}") from exc
    if "y" not in arrays:
        raise ImportRefused(f"--data {path} has no array 'y' (the labels); it has "
                            f"{sorted(arrays)}")
    if len(input_names) == 1 and "x" in arrays:
        return {input_names[0]: arrays["x"]}, arrays["y"]
    missing = [n for n in input_names if n not in arrays]
    if missing:
        raise ImportRefused(f"--data {path} lacks the model's input(s) {missing}; it has "
                            f"{sorted(arrays)}",
                            hint="name the inputs' arrays after them (or 'x' for one input)")
    return {n: arrays[n] for n in input_names}, arrays["y"]


def _folder(path: Path, input_names: Sequence[str], labels: Sequence[str]
            ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    if len(input_names) != 1:
        raise ImportRefused(f"--data {path}: a folder of .npy files feeds one input; this "
                            f"model takes {list(input_names)}", hint="use an .npz instead")
    table = path / LABELS_CSV
    if not table.is_file():
        raise ImportRefused(f"--data {path} has no {LABELS_CSV}",
                            hint="one row per sample: file,label")
    rows = _rows(table)
    samples, targets = [], []
    for file, label in rows:
        sample = path / file
        if not sample.is_file():
            raise ImportRefused(f"{table}: {file!r} does not exist in {path}")
        try:
            samples.append(np.load(sample, allow_pickle=False))
        except (OSError, ValueError) as exc:
            raise ImportRefused(f"{sample} is not a readable .npy: {exc}") from exc
        targets.append(_label(label, labels, table))
    shapes = {s.shape for s in samples}
    if len(shapes) > 1:
        raise ImportRefused(f"--data {path}: samples differ in shape {sorted(shapes)}")
    x = np.stack(samples) if samples else np.zeros((0,))
    return {input_names[0]: x}, np.asarray(targets)


def _rows(table: Path) -> list[tuple[str, str]]:
    with table.open(newline="") as f:
        rows = [r for r in csv.reader(f) if r and any(c.strip() for c in r)]
    if rows and rows[0][:2] == ["file", "label"]:
        rows = rows[1:]
    bad = [i for i, r in enumerate(rows) if len(r) < 2]
    if bad:
        raise ImportRefused(f"{table}: row {bad[0] + 1} is not 'file,label'")
    return [(r[0].strip(), r[1].strip()) for r in rows]


def _label(text: str, names: Sequence[str], table: Path) -> int:
    if text in names:
        return list(names).index(text)
    try:
        return int(text)
    except ValueError:
        raise ImportRefused(f"{table}: label {text!r} is neither a class id nor one of the "
                            f"task's labels {list(names)}") from None


def _digest(x: Mapping[str, np.ndarray], y: np.ndarray) -> str:
    h = hashlib.sha256()
    for name in sorted(x):
        h.update(name.encode())
        h.update(np.ascontiguousarray(x[name]).tobytes())
    h.update(np.ascontiguousarray(y).tobytes())
    return h.hexdigest()
