"""Small real ONNX models for "bring your own model" tests, built with ``onnx.helper`` (no
torch), and labelled data each model gets partly right (so a metric is neither 0 nor 1 and a
cascade curve is not flat).

Every model takes ``x`` FP32 (N, 4) unless said otherwise; its weights are fixed here, so
the data makers below know what it answers. Imported by tests under ``tests/`` (the
``tests/conftest.py`` beside this file puts this folder on ``sys.path``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
FEATURES = 4
CLASSES = 3
BOXES = 2  # detection slots per image

# Fixed weights: (FEATURES, CLASSES) and (CLASSES,).
W_CLS = np.array([[1.5, -0.5, 0.2], [-0.3, 1.2, -0.8], [0.4, 0.3, 1.1], [-1.0, 0.6, 0.5]],
                 np.float32)
B_CLS = np.array([0.1, -0.2, 0.05], np.float32)
W_ML = np.array([[1.0, -0.7, 0.3], [0.2, 1.1, -0.6], [-0.9, 0.4, 1.0], [0.5, 0.5, -0.4]],
                np.float32)
B_ML = np.array([0.0, 0.1, -0.1], np.float32)
W_REG = np.array([0.8, -1.2, 0.5, 2.0], np.float32)
B_REG = 0.3
W_EMB = np.array([[1.0, 0.0, 0.3], [0.2, 1.0, 0.0], [0.0, 0.4, 1.0], [0.5, -0.5, 0.2]],
                 np.float32)

_ONNX_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE}


def _init(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def _save(path: Path, nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
          outputs: list[onnx.ValueInfoProto], inits: list[onnx.TensorProto]) -> Path:
    graph = helper.make_graph(nodes, path.stem.replace("-", "_"), inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              ir_version=8, producer_name="tierlink-tests")
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def _tensor(name: str, shape: Sequence[int | str], dtype: np.dtype | type = np.float32
            ) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, _ONNX_TYPES[np.dtype(dtype)], list(shape))


def classifier(path: Path, *, input_name: str = "x", features: int = FEATURES,
               dtype: type = np.float32, output: str = "logits",
               probabilities: bool = False) -> Path:
    """MatMul + Add -> (N, CLASSES) logits; with ``probabilities``, a Softmax after them.
    ``features`` other than FEATURES gives a model of another signature (zero-padded W)."""
    w = np.zeros((features, CLASSES), dtype)
    w[:min(features, FEATURES)] = W_CLS[:features]
    nodes = [helper.make_node("MatMul", [input_name, "W"], ["z"]),
             helper.make_node("Add", ["z", "B"], ["logits_raw" if probabilities else output])]
    if probabilities:
        nodes.append(helper.make_node("Softmax", ["logits_raw"], [output], axis=1))
    return _save(path, nodes, [_tensor(input_name, ["N", features], dtype)],
                 [_tensor(output, ["N", CLASSES], dtype)],
                 [_init("W", w), _init("B", B_CLS.astype(dtype))])


def multi_exit(directory: Path) -> Path:
    """A two-exit model's segments in ``directory``, named so that sorting them gets the
    order wrong (the chain decides it): ``b-head.onnx`` passes x on as ``features`` and
    answers the classifier's logits halved at ``exit1`` (the same classes, less sure);
    ``a-tail.onnx`` answers the classifier's logits."""
    head = [helper.make_node("Identity", ["x"], ["features"]),
            helper.make_node("MatMul", ["x", "W"], ["z"]),
            helper.make_node("Add", ["z", "B"], ["y"]),
            helper.make_node("Mul", ["y", "H"], ["exit1"])]
    _save(directory / "b-head.onnx", head, [_tensor("x", ["N", FEATURES])],
          [_tensor("features", ["N", FEATURES]), _tensor("exit1", ["N", CLASSES])],
          [_init("W", W_CLS), _init("B", B_CLS), _init("H", np.array(0.5, np.float32))])
    tail = [helper.make_node("MatMul", ["features", "W"], ["z"]),
            helper.make_node("Add", ["z", "B"], ["logits"])]
    _save(directory / "a-tail.onnx", tail, [_tensor("features", ["N", FEATURES])],
          [_tensor("logits", ["N", CLASSES])], [_init("W", W_CLS), _init("B", B_CLS)])
    return directory


def two_input_classifier(path: Path) -> Path:
    """Inputs ``a`` (N, 3) and ``b`` (N, 1), concatenated: the classifier of ``x = [a, b]``."""
    nodes = [helper.make_node("Concat", ["a", "b"], ["x"], axis=1),
             helper.make_node("MatMul", ["x", "W"], ["z"]),
             helper.make_node("Add", ["z", "B"], ["logits"])]
    return _save(path, nodes, [_tensor("a", ["N", 3]), _tensor("b", ["N", 1])],
                 [_tensor("logits", ["N", CLASSES])], [_init("W", W_CLS), _init("B", B_CLS)])


def multilabel(path: Path) -> Path:
    """(N, CLASSES) independent logits, one yes/no per label."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["z"]),
             helper.make_node("Add", ["z", "B"], ["scores"])]
    return _save(path, nodes, [_tensor("x", ["N", FEATURES])],
                 [_tensor("scores", ["N", CLASSES])], [_init("W", W_ML), _init("B", B_ML)])


def regression(path: Path, *, uncertainty: bool = True) -> Path:
    """``value`` (N,) = x . W_REG + B_REG; with ``uncertainty``, also ``sd`` (N,) =
    0.5 |x0| + 0.1 (a standard deviation the data below honours)."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["z"]),
             helper.make_node("Add", ["z", "B"], ["value"])]
    outputs = [_tensor("value", ["N"])]
    inits = [_init("W", W_REG), _init("B", np.float32(B_REG))]
    if uncertainty:
        nodes += [helper.make_node("MatMul", ["x", "E0"], ["x0"]),
                  helper.make_node("Abs", ["x0"], ["a0"]),
                  helper.make_node("Mul", ["a0", "half"], ["h0"]),
                  helper.make_node("Add", ["h0", "floor"], ["sd"])]
        outputs.append(_tensor("sd", ["N"]))
        inits += [_init("E0", np.eye(FEATURES, dtype=np.float32)[0]),
                  _init("half", np.float32(0.5)), _init("floor", np.float32(0.1))]
    return _save(path, nodes, [_tensor("x", ["N", FEATURES])], outputs, inits)


def embedder(path: Path) -> Path:
    """``vec`` (N, 3) = x W_EMB: a linear embedding."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["vec"])]
    return _save(path, nodes, [_tensor("x", ["N", FEATURES])], [_tensor("vec", ["N", 3])],
                 [_init("W", W_EMB)])


def detector(path: Path) -> Path:
    """Input ``x`` (N, BOXES*5): the first BOXES*4 values are the boxes, the last BOXES the
    score logits. Outputs ``boxes`` (N, BOXES, 4) and ``scores`` (N, BOXES) = sigmoid."""
    cut = BOXES * 4
    nodes = [helper.make_node("Slice", ["x", "zero", "cut", "one"], ["flat"]),
             helper.make_node("Reshape", ["flat", "box_shape"], ["boxes"]),
             helper.make_node("Slice", ["x", "cut", "end", "one"], ["logit"]),
             helper.make_node("Sigmoid", ["logit"], ["scores"])]
    inits = [_init("zero", np.array([0], np.int64)), _init("cut", np.array([cut], np.int64)),
             _init("end", np.array([cut + BOXES], np.int64)),
             _init("one", np.array([1], np.int64)),
             _init("box_shape", np.array([-1, BOXES, 4], np.int64))]
    return _save(path, nodes, [_tensor("x", ["N", BOXES * 5])],
                 [_tensor("boxes", ["N", BOXES, 4]), _tensor("scores", ["N", BOXES])], inits)


def two_outputs_classifier(path: Path) -> Path:
    """A classifier with a second output (its features): which is the scores is ambiguous."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["z"]),
             helper.make_node("Add", ["z", "B"], ["logits"]),
             helper.make_node("Identity", ["x"], ["features"])]
    return _save(path, nodes, [_tensor("x", ["N", FEATURES])],
                 [_tensor("logits", ["N", CLASSES]), _tensor("features", ["N", FEATURES])],
                 [_init("W", W_CLS), _init("B", B_CLS)])


# -- data each model gets partly right ---------------------------------------------------

def features(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, FEATURES)).astype(np.float32)


def _flip(rng: np.random.Generator, n: int, share: float) -> np.ndarray:
    """Exactly round(share * n) rows, chosen at random."""
    mask = np.zeros(n, bool)
    mask[rng.choice(n, round(share * n), replace=False)] = True
    return mask


def classification_data(n: int = 200, seed: int = 0, wrong: float = 0.25
                        ) -> tuple[np.ndarray, np.ndarray]:
    """(x, y): the classifier is right on all but ``wrong`` of the samples."""
    x = features(n, seed)
    y = (x @ W_CLS + B_CLS).argmax(axis=1)
    flip = _flip(np.random.default_rng(seed + 1), n, wrong)
    y[flip] = (y[flip] + 1) % CLASSES
    return x, y.astype(np.int64)


def multilabel_data(n: int = 200, seed: int = 0, wrong: float = 0.25
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(x, y (N, CLASSES) of 0/1): ``wrong`` of the samples get one label flipped."""
    x = features(n, seed)
    y = (x @ W_ML + B_ML > 0).astype(np.int64)
    rng = np.random.default_rng(seed + 1)
    flip = _flip(rng, n, wrong)
    cols = rng.integers(0, CLASSES, n)
    y[flip, cols[flip]] = 1 - y[flip, cols[flip]]
    return x, y


def regression_data(n: int = 200, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(x, y (N,)): the model's value plus noise of its own standard deviation."""
    x = features(n, seed)
    sd = 0.5 * np.abs(x[:, 0]) + 0.1
    noise = np.random.default_rng(seed + 1).normal(size=n) * sd
    return x, (x @ W_REG + B_REG + noise).astype(np.float32)


def embedding_data(n: int = 200, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(x, class ids): noisy points around one centre per class, the classes overlapping."""
    rng = np.random.default_rng(seed)
    centres = np.array([[2, 0, 0, 0], [0, 2, 0, 0], [0, 0, 2, 0]], np.float32)
    y = rng.integers(0, CLASSES, n)
    x = centres[y] + rng.normal(scale=1.2, size=(n, FEATURES))
    return x.astype(np.float32), y.astype(np.int64)


def detection_data(n: int = 120, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(x (N, BOXES*5), y (N, BOXES, 5)). Each image has one true box (class 0; the second
    row pads with class -1). The detector's first slot is that box; its second slot is a
    false positive on a third of the images (score sure, certain or not), else dropped;
    on a sixth of the images the first box is off (missed)."""
    rng = np.random.default_rng(seed)
    lo = rng.uniform(0, 50, size=(n, 2))
    truth = np.concatenate([lo, lo + rng.uniform(5, 20, size=(n, 2))], axis=1)  # (N, 4)
    y = np.full((n, BOXES, 5), -1.0, np.float32)
    y[:, 0, :4], y[:, 0, 4] = truth, 0
    first = truth.copy()
    missed = rng.random(n) < 1 / 6
    first[missed] += 100.0  # far away: IoU 0
    second = truth + 200.0
    false_pos = rng.random(n) < 1 / 3
    logit1 = rng.uniform(1.0, 4.0, n)  # kept, sure to varying degrees
    logit2 = np.where(false_pos, rng.uniform(0.2, 3.0, n), rng.uniform(-4.0, -2.5, n))
    x = np.concatenate([first, second, logit1[:, None], logit2[:, None]], axis=1)
    return x.astype(np.float32), y


def save_npz(path: Path, **arrays: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    return path


def npy_folder(path: Path, x: np.ndarray, labels: Sequence[object],
               header: bool = True) -> Path:
    """One ``.npy`` per sample and a ``labels.csv`` (file,label) naming them."""
    path.mkdir(parents=True, exist_ok=True)
    rows = ["file,label"] if header else []
    for i, (sample, label) in enumerate(zip(x, labels, strict=True)):
        np.save(path / f"s{i:04d}.npy", sample)
        rows.append(f"s{i:04d}.npy,{label}")
    (path / "labels.csv").write_text("\n".join(rows) + "\n")
    return path


PYTHON_MODEL = '''
"""A user's Python model: the classifier above (W_CLS, B_CLS) as numpy, its weights in a
data file beside the module, and a knob to make it a worse model."""
from pathlib import Path

import numpy as np


class Model:
    inputs = [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def load(self) -> None:
        data = np.load(self.path / "weights.npz")
        self.w, self.b = data["w"], data["b"]

    def predict(self, inputs: dict) -> dict:
        return {"logits": (inputs["x"] @ self.w + self.b).astype(np.float32)}
'''


def python_classifier(directory: Path, *, scale: float = 1.0, noise: float = 0.0,
                      declare_inputs: bool = True, module: str = "model") -> Path:
    """A Python model's source (``model.py`` + ``weights.npz``): the same answers as
    :func:`classifier` (``scale`` multiplies the weights: its confidence changes, its
    answers do not; ``noise`` perturbs them, seeded: a worse model of the task)."""
    directory.mkdir(parents=True, exist_ok=True)
    source = PYTHON_MODEL if declare_inputs else PYTHON_MODEL.replace(
        '    inputs = [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]\n', "")
    (directory / f"{module}.py").write_text(source)
    w = W_CLS * scale + noise * np.random.default_rng(5).normal(size=W_CLS.shape)
    np.savez(directory / "weights.npz", w=w.astype(np.float32), b=B_CLS * scale)
    return directory
