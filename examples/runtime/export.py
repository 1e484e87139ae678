"""Train two models of the ``digits`` task with PyTorch and save them as ``torch.export``
programs (``.pt2``) — a user's models in PyTorch's own format, for the ``pt2`` runtime of
this package: ``digits-small`` (a linear layer, for devices) and ``digits-large`` (a
two-layer perceptron, for the cloud), and the held-out 40% of the data as ``heldout.npz``
(``x``, ``y``) for ``tierlink model import --data``.

The data ships inside scikit-learn (``load_digits``: 1,797 8x8 handwritten digits; nothing
is downloaded). Seeded, single-threaded, a few seconds::

    python examples/runtime/export.py --out /tmp/pt2-digits
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

FAMILY = {"digits-small": lambda: nn.Linear(64, 10),
          "digits-large": lambda: nn.Sequential(nn.Linear(64, 256), nn.ReLU(),
                                                nn.Linear(256, 10))}


def train(net: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int = 60) -> nn.Module:
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(epochs):
        for idx in torch.randperm(len(x)).split(64):
            opt.zero_grad()
            nn.functional.cross_entropy(net(x[idx]), y[idx]).backward()
            opt.step()
    return net.eval()


def export(net: nn.Module, path: Path) -> None:
    """The program, its batch dimension free (1 to 256 samples per call)."""
    batch = torch.export.Dim("batch", min=1, max=256)
    program = torch.export.export(net, (torch.zeros(2, 64),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    digits = load_digits()
    pixels = (digits.data / 16.0).astype(np.float32)
    x_train, x_held, y_train, y_held = train_test_split(
        pixels, digits.target, test_size=0.4, random_state=0, stratify=digits.target)
    args.out.mkdir(parents=True, exist_ok=True)
    x, y = torch.from_numpy(x_train), torch.from_numpy(y_train).long()
    for name, build in FAMILY.items():
        net = train(build(), x, y)
        export(net, args.out / f"{name}.pt2")
        accuracy = (net(torch.from_numpy(x_held)).argmax(1).numpy() == y_held).mean()
        print(f"{name}: {100 * accuracy:.1f}% on the held-out digits")
    np.savez(args.out / "heldout.npz", x=x_held, y=y_held.astype(np.int64))


if __name__ == "__main__":
    main()
