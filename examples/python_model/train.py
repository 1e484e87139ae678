"""Train the two models of the ``digits`` family with scikit-learn, outside tierlink.

The data ships inside scikit-learn (``load_digits``: 1,797 8x8 handwritten digits; nothing
is downloaded). ``digits-linear`` (logistic regression, for devices) and ``digits-mlp`` (a
two-layer perceptron, for the cloud) are trained on 60% of it; the other 40% is written as
``heldout.npz`` (``pixels``, ``y``) for ``tierlink model import --data``. Each model is a
directory tierlink imports as it is: ``model.py`` (the class it serves) and
``weights.npz`` (its weights as arrays).

    python examples/python_model/train.py --out /tmp/digits     # a few seconds
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    out = parser.parse_args().out
    digits = load_digits()
    x = digits.data.astype(np.float32)  # (1797, 64), pixel values 0..16
    train_x, held_x, train_y, held_y = train_test_split(
        x, digits.target, test_size=0.4, random_state=0, stratify=digits.target)
    linear = LogisticRegression(max_iter=2000, C=0.05).fit(train_x / 16.0, train_y)
    mlp = MLPClassifier(hidden_layer_sizes=(64,), max_iter=600, random_state=0).fit(
        train_x / 16.0, train_y)
    save(out / "digits-linear", [(linear.coef_.T, linear.intercept_)])
    save(out / "digits-mlp", list(zip(mlp.coefs_, mlp.intercepts_, strict=True)))
    np.savez(out / "heldout.npz", pixels=held_x, y=held_y)
    for name, model in (("digits-linear", linear), ("digits-mlp", mlp)):
        print(f"{name}: held-out accuracy {model.score(held_x / 16.0, held_y):.4f}")


def save(directory: Path, layers: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """The model's directory: the class tierlink serves, and its weights as arrays."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(HERE / "model.py", directory / "model.py")
    np.savez(directory / "weights.npz",
             **{f"{k}{i}": a.astype(np.float32) for i, (w, b) in enumerate(layers)
                for k, a in (("w", w), ("b", b))})


if __name__ == "__main__":
    main()
