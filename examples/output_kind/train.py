"""Train two segmentation models of handwritten digits with PyTorch and export them to ONNX
— a user's models of a task no built-in kind reads: every pixel gets a class, background
(0) or the digit it belongs to (1 + the digit). ``digit-masks-small`` (for devices) and
``digit-masks-large`` (for the cloud) each score (batch, 11, 8, 8): a per-pixel ink score
from convolutions plus the image's digit scores from a classifier head. The held-out 40% of
the data is written as ``heldout.npz`` (``x``: (N, 1, 8, 8) images, ``y``: (N, 8, 8) masks)
for ``tierlink model import --data``.

The data ships inside scikit-learn (``load_digits``: 1,797 8x8 handwritten digits; nothing
is downloaded); a pixel is ink when its value reaches a quarter of the scale. Seeded,
single-threaded, a few seconds::

    python examples/output_kind/train.py --out /tmp/digit-masks
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

INK = 0.25


class MaskNet(nn.Module):
    """scores[b, 0] = background; scores[b, 1 + k] = ink score + the image's digit-k score."""

    def __init__(self, ink: nn.Module, digit: nn.Module) -> None:
        super().__init__()
        self.ink, self.digit = ink, digit

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        ink = self.ink(image)  # (B, 1, 8, 8)
        digit = self.digit(image.flatten(1))[:, :, None, None]  # (B, 10, 1, 1)
        return torch.cat([-ink, ink + digit], dim=1)  # (B, 11, 8, 8)


FAMILY: dict[str, Callable[[], MaskNet]] = {
    "digit-masks-small": lambda: MaskNet(nn.Conv2d(1, 1, 3, padding=1), nn.Linear(64, 10)),
    "digit-masks-large": lambda: MaskNet(
        nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 1, 3, padding=1)),
        nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))),
}


def train(net: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int = 40) -> nn.Module:
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(epochs):
        for idx in torch.randperm(len(x)).split(64):
            opt.zero_grad()
            nn.functional.cross_entropy(net(x[idx]), y[idx]).backward()
            opt.step()
    return net.eval()


def mean_iou(mask: np.ndarray, truth: np.ndarray, classes: int = 11) -> float:
    ious = [((mask == c) & (truth == c)).sum() / ((mask == c) | (truth == c)).sum()
            for c in range(classes) if ((mask == c) | (truth == c)).any()]
    return float(np.mean(ious))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]  # (N, 1, 8, 8)
    masks = np.where(images[:, 0] >= INK, digits.target[:, None, None] + 1, 0).astype(np.int64)
    x_train, x_held, y_train, y_held = train_test_split(
        images, masks, test_size=0.4, random_state=0, stratify=digits.target)
    args.out.mkdir(parents=True, exist_ok=True)
    x, y = torch.from_numpy(x_train), torch.from_numpy(y_train)
    for name, build in FAMILY.items():
        net = train(build(), x, y)
        torch.onnx.export(net, (torch.zeros(2, 1, 8, 8),), str(args.out / f"{name}.onnx"),
                          dynamo=False, input_names=["image"], output_names=["scores"],
                          dynamic_axes={"image": {0: "batch"}, "scores": {0: "batch"}})
        with torch.no_grad():
            mask = net(torch.from_numpy(x_held)).argmax(1).numpy()
        print(f"{name}: mean IoU {mean_iou(mask, y_held):.3f} on the held-out digits")
    np.savez(args.out / "heldout.npz", x=x_held, y=y_held)


if __name__ == "__main__":
    main()
