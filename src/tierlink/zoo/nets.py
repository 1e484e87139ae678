"""The zoo's network family: 3x3 conv + BatchNorm + ReLU stages, VGG style.

Imports torch at module level: only the zoo builder imports this module. Every net takes raw
pixels in [0, 1] shaped (N, 1, 28, 28) and normalises inside the graph with its task's pixel
statistics, so the exported ONNX model needs no preprocessing beyond scaling bytes to
[0, 1]; it returns logits (N, 10).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from tierlink.errors import ZooError
from tierlink.zoo.profiles import SPECS, NetSpec, data_stats

NUM_CLASSES = 10


class Normalize(nn.Module):
    """(x - mean) / std with constants, exported into the ONNX graph."""

    def __init__(self, mean: float, std: float) -> None:
        super().__init__()
        self.mean, self.std = mean, std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


def _conv(cin: int, cout: int) -> list[nn.Module]:
    # No conv bias: BatchNorm's shift replaces it (and folds into the conv on export).
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True)]


def _features(spec: NetSpec, norm: Normalize) -> tuple[list[nn.Module], int]:
    layers: list[nn.Module] = [norm]
    cin = 1
    for i, widths in enumerate(spec.stages):
        for cout in widths:
            layers += _conv(cin, cout)
            cin = cout
        if i < len(spec.stages) - 1:
            layers.append(nn.MaxPool2d(2))  # (N, C, H, W) -> (N, C, H/2, W/2)
    return layers, cin


def _head(spec: NetSpec, channels: int) -> list[nn.Module]:
    if spec.head == "gap":
        # (N, C, 7, 7) -> (N, C) -> (N, 10)
        return [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(spec.dropout),
                nn.Linear(channels, NUM_CLASSES)]
    if spec.head == "flatten":
        # (N, C, 7, 7) -> (N, C, 3, 3) -> (N, 9C) [-> (N, hidden)] -> (N, 10)
        layers: list[nn.Module] = [nn.MaxPool2d(2), nn.Flatten(), nn.Dropout(spec.dropout)]
        features = channels * 9
        if spec.hidden:
            layers += [nn.Linear(features, spec.hidden), nn.BatchNorm1d(spec.hidden),
                       nn.ReLU(inplace=True), nn.Dropout(spec.dropout)]
            features = spec.hidden
        return [*layers, nn.Linear(features, NUM_CLASSES)]
    raise ZooError(f"unknown head {spec.head!r}; expected 'gap' or 'flatten'")


def build_net(variant: str, task: str = "fmnist") -> nn.Sequential:
    """A freshly initialised net for ``variant`` (``small``, ``medium`` or ``large``) that
    normalises its input with ``task``'s pixel statistics."""
    spec = SPECS.get(variant)
    if spec is None:
        raise ZooError(f"unknown zoo variant {variant!r}; expected one of {sorted(SPECS)}")
    stats = data_stats(task)
    layers, channels = _features(spec, Normalize(stats.pixel_mean, stats.pixel_std))
    return nn.Sequential(*layers, *_head(spec, channels))


def fold_linear_batchnorm(net: nn.Sequential) -> nn.Sequential:
    """An eval-mode copy of ``net`` where every Linear followed by BatchNorm1d is one Linear.

    The TorchScript exporter folds BatchNorm into convolutions but not into a Linear; this
    does it for the dense head so the exported graph has no BatchNormalization node:
    W' = W * s, b' = (b - mean) * s + beta, with s = gamma / sqrt(var + eps) per output.
    """
    layers = [copy.deepcopy(m) for m in net]
    for i in range(len(layers) - 1):
        linear, bn = layers[i], layers[i + 1]
        if isinstance(linear, nn.Linear) and isinstance(bn, nn.BatchNorm1d):
            _fold_into(linear, bn)
            layers[i + 1] = nn.Identity()
    return nn.Sequential(*layers).eval()


@torch.no_grad()
def _fold_into(linear: nn.Linear, bn: nn.BatchNorm1d) -> None:
    mean, var = bn.running_mean, bn.running_var
    if mean is None or var is None:
        raise ZooError("cannot fold a BatchNorm1d that tracks no running statistics")
    scale = bn.weight / torch.sqrt(var + bn.eps)  # (out,)
    bias = linear.bias if linear.bias is not None else torch.zeros_like(scale)
    linear.weight.mul_(scale[:, None])  # (out, in)
    linear.bias = nn.Parameter((bias - mean) * scale + bn.bias)


def count_params(net: nn.Module) -> int:
    """Trainable parameters (BatchNorm running statistics excluded)."""
    return sum(p.numel() for p in net.parameters() if p.requires_grad)
