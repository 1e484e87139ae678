"""The model class tierlink serves: what a user writes for a family that is not ONNX.

tierlink calls ``Model(path)`` with the directory holding this file and the files beside it
(``weights.npz``), then ``load()`` once, then ``predict(inputs)`` for every batch on a worker
thread. ``predict`` returns the outputs the task declares — here ``logits`` for a
classifier — so tierlink calibrates, thresholds and cascades it like any other model. Only
numpy is needed at serving time: the weights were trained with scikit-learn (``train.py``)
and saved as arrays, so no pickle crosses the fleet.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


class Model:
    # What a request carries: 8x8 digit images, flattened, pixel values 0..16.
    inputs = [{"name": "pixels", "datatype": "FP32", "shape": [-1, 64]}]

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.layers: list[tuple[np.ndarray, np.ndarray]] = []

    def load(self) -> None:
        weights = np.load(self.path / "weights.npz")
        count = len([k for k in weights.files if k.startswith("w")])
        self.layers = [(weights[f"w{i}"], weights[f"b{i}"]) for i in range(count)]

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        h = inputs["pixels"] / 16.0  # (N, 64)
        for i, (w, b) in enumerate(self.layers):
            h = h @ w + b  # (N, units)
            if i < len(self.layers) - 1:
                h = np.maximum(h, 0.0)  # ReLU between layers
        return {"logits": h.astype(np.float32)}  # (N, 10)
