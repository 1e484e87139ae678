"""Build the multi-exit Fashion-MNIST net of :mod:`tierlink.zoo.exits`: define it, train it
with the zoo's loop (:func:`tierlink.zoo.build.train_net`) on the joint loss, export and
verify its segments, measure them and write the card.

Imports torch: only :func:`tierlink.zoo.exits.ensure_exits` imports this module, and only
when a build is needed. The layout and fingerprint live in :mod:`tierlink.zoo.exits`, the
card in :mod:`tierlink.models.exit_card`, the threshold search in
:mod:`tierlink.models.exit_runner`; bump ``EXITS_VERSION`` in :mod:`tierlink.zoo.exits`
when a change here alters the weights or the card.
"""

from __future__ import annotations

import copy
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn
from torch.nn import functional

from tierlink.core.progress import Phase, Reporter
from tierlink.errors import ZooError
from tierlink.models.card import ModelCard, TrainingInfo, save_card, with_exit_header
from tierlink.models.data import Labelled, Splits
from tierlink.models.exit_card import (
    ExitInfo,
)
from tierlink.models.exit_measure import measure_net
from tierlink.models.exit_runner import (
    Clock,
    exit_logits,
)
from tierlink.models.layout import CARD_FILE
from tierlink.models.onnx import ort_session
from tierlink.zoo.build import EXPORT_ATOL, OPSET, Trained, _torch_threads, train_net
from tierlink.zoo.datasets import load_splits
from tierlink.zoo.exits import (
    BASE_VARIANT,
    BRANCHES,
    EXIT_NAMES,
    EXITS_NAME,
    EXITS_VERSION,
    LOSS_WEIGHTS,
    SEGMENT_INPUTS,
    SEGMENT_OUTPUTS,
    TASK,
    exits_fingerprint,
    exits_recipe,
)
from tierlink.zoo.nets import (
    NUM_CLASSES,
    Normalize,
    _conv,
    _head,
    count_params,
    fold_linear_batchnorm,
)
from tierlink.zoo.profiles import SPECS, BuildProfile, TrainRecipe, data_stats

CHAIN_ATOL = 1e-5  # segments s1 -> s2 -> s3 against the whole graph


# --- the net --------------------------------------------------------------------------------


class Segment(nn.Module):
    """``trunk`` then, when there is one, a side ``branch`` on the trunk's features:
    x -> (features, exit logits); without a branch: x -> logits."""

    def __init__(self, trunk: nn.Sequential, branch: nn.Sequential | None) -> None:
        super().__init__()
        self.trunk, self.branch = trunk, branch

    def forward(self, x: torch.Tensor) -> Any:
        features = self.trunk(x)
        return features if self.branch is None else (features, self.branch(features))


class Chain(nn.Module):
    """Segments in a row: x -> (exit1, exit2, ..., logits)."""

    def __init__(self, segments: Sequence[nn.Module]) -> None:
        super().__init__()
        self.segments = nn.ModuleList(segments)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        exits = []
        for segment in self.segments[:-1]:
            x, logits = segment(x)
            exits.append(logits)
        return (*exits, self.segments[-1](x))


def build_chain(task: str = TASK) -> Chain:
    """A freshly initialised multi-exit net: the ``large`` stages with side branches."""
    spec, stats = SPECS[BASE_VARIANT], data_stats(task)
    segments, cin = [], 1
    for i, widths in enumerate(spec.stages):
        layers: list[nn.Module] = [Normalize(stats.pixel_mean, stats.pixel_std)] if i == 0 else []
        for cout in widths:
            layers += _conv(cin, cout)
            cin = cout
        if i < len(spec.stages) - 1:
            layers.append(nn.MaxPool2d(2))  # (N, C, H, W) -> (N, C, H/2, W/2)
            width, pool_first = BRANCHES[i]
            segments.append(Segment(nn.Sequential(*layers), _branch(cin, width, pool_first)))
        else:
            segments.append(Segment(nn.Sequential(*layers, *_head(spec, cin)), None))
    return Chain(segments)


def _branch(channels: int, width: int, pool_first: bool) -> nn.Sequential:
    # (N, C, 14, 14) -> [pool_first] (N, C, 7, 7) -> (N, w, 7, 7) -> (N, w, 3, 3) -> (N, 9w)
    # -> (N, 10): the conv runs at 7x7 for both exits, so each costs C * w * 9 * 49 MACs.
    pool: list[nn.Module] = [nn.MaxPool2d(2)] if pool_first else []
    return nn.Sequential(*pool, *_conv(channels, width), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(width * 9, NUM_CLASSES))


# --- building and training ------------------------------------------------------------------


def build_exits(profile: BuildProfile, out_dir: Path, reporter: Reporter, *,
                splits: Splits | None = None, clock: Clock = time.perf_counter) -> ModelCard:
    """Train the multi-exit net, export and verify its segments, measure them and write the
    card (last: a card on disk always describes complete, verified files). One phase of
    ``reporter``, as :func:`tierlink.zoo.build.build_model`'s."""
    splits = load_splits(TASK) if splits is None else splits
    out_dir.mkdir(parents=True, exist_ok=True)
    with reporter.phase(EXITS_NAME, heartbeat=True) as phase:
        card = _build_exits(profile, out_dir, splits, phase, clock)
        accuracies = ", ".join(f"{100 * e.test_accuracy:.2f}%" for e in exits_of(card))
        phase.finish(f"test accuracy per exit {accuracies}")
    return card


def _build_exits(profile: BuildProfile, out_dir: Path, splits: Splits, phase: Phase,
                 clock: Clock) -> ModelCard:
    train = splits.train.head(profile.train_samples or len(splits.train))
    with _torch_threads(profile.threads), torch.random.fork_rng(devices=[]):
        trained = train_chain(train, exits_recipe(profile), profile.seed, phase, clock)
        phase.stage("exporting")
        paths = export_exits(trained.net, out_dir, check_on=splits.calib.input[:64])
        macs = segment_macs(trained.net)
    phase.stage("evaluating")
    card = measure_exits(paths, trained, macs, splits, profile)
    save_card(card, out_dir / CARD_FILE)
    return card


def train_chain(data: Labelled, recipe: TrainRecipe, seed: int, progress: Phase,
                clock: Clock = time.perf_counter) -> Trained:
    """Train a fresh multi-exit net on ``data`` with the zoo's loop (Nesterov SGD, one-cycle
    schedule, flips) and the joint loss ``sum(w_k * CE(exit_k))``."""
    return train_net(EXITS_NAME, BASE_VARIANT, recipe, data, seed, progress, clock, task=TASK,
                     make_net=build_chain, loss_fn=joint_loss)


def joint_loss(outputs: Sequence[torch.Tensor], y: torch.Tensor) -> torch.Tensor:
    """BranchyNet's weighted sum of each exit's cross-entropy (``LOSS_WEIGHTS``)."""
    # outputs: (exit1, exit2, logits), each (B, 10); y: (B,)
    return cast(torch.Tensor, sum(w * functional.cross_entropy(z, y)
                                  for w, z in zip(LOSS_WEIGHTS, outputs, strict=True)))


# --- export ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExitPaths:
    """The exported files: one per segment, and the whole chain."""

    segments: tuple[Path, ...]
    whole: Path


def export_exits(chain: nn.Module, out_dir: Path, check_on: np.ndarray) -> ExitPaths:
    """Export each segment and the whole chain (BatchNorm folded), then verify: ONNX Runtime
    agrees with torch within ``EXPORT_ATOL`` and the chained segments with the whole graph
    within ``CHAIN_ATOL``."""
    folded = [_folded(s) for s in _segments(chain)]
    x = torch.zeros(2, 1, 28, 28)
    segments = []
    for k, segment in enumerate(folded):
        path = out_dir / f"{EXITS_NAME}-s{k + 1}.onnx"
        _export(segment, x, path, SEGMENT_INPUTS[k], SEGMENT_OUTPUTS[k])
        segments.append(path)
        with torch.no_grad():
            out = segment(x)
        x = out[0] if isinstance(out, tuple) else out
    whole = out_dir / f"{EXITS_NAME}.onnx"
    _export(Chain(folded).eval(), torch.zeros(2, 1, 28, 28), whole, "input", EXIT_NAMES)
    paths = ExitPaths(tuple(segments), whole)
    _verify(chain, paths, check_on)
    return paths


def _folded(segment: nn.Module) -> nn.Module:
    parts = cast(Segment, segment)
    branch = None if parts.branch is None else copy.deepcopy(parts.branch).eval()
    return Segment(fold_linear_batchnorm(parts.trunk), branch).eval()


def _segments(chain: nn.Module) -> list[nn.Module]:
    return list(cast(Chain, chain).segments)


def _export(module: nn.Module, sample: torch.Tensor, path: Path, input_name: str,
            output_names: Sequence[str]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    names = (input_name, *output_names)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
            torch.onnx.export(module, (sample,), str(tmp), dynamo=False, opset_version=OPSET,
                              input_names=[input_name], output_names=list(output_names),
                              dynamic_axes={n: {0: "batch"} for n in names},
                              do_constant_folding=True)
    except Exception as exc:  # the exporter raises many unrelated types
        tmp.unlink(missing_ok=True)
        raise ZooError(f"ONNX export of {path.name} failed: {exc}") from exc
    os.replace(tmp, path)


def _verify(chain: nn.Module, paths: ExitPaths, images: np.ndarray) -> None:
    with torch.no_grad():
        expected = [z.numpy() for z in chain(torch.from_numpy(images))]  # 3 x (B, 10)
    chained = exit_logits([ort_session(p, 1) for p in paths.segments], images)
    whole = ort_session(paths.whole, 1).run(None, {"input": images})
    for name, want, got, atol in [
        *(("segments vs torch", w, g, EXPORT_ATOL) for w, g in zip(expected, chained)),
        *(("segments vs whole", w, g, CHAIN_ATOL) for w, g in zip(whole, chained)),
    ]:
        err = float(np.abs(got - want).max())
        if got.shape != want.shape or err > atol:
            raise ZooError(f"{EXITS_NAME} export check failed ({name}): max |diff| "
                           f"{err:.2e} > {atol} (shapes {got.shape} vs {want.shape})")


def segment_macs(chain: nn.Module) -> tuple[int, ...]:
    """Multiply-accumulates per sample of each segment (convolutions and dense layers)."""
    macs = []
    x = torch.zeros(1, 1, 28, 28)
    for segment in _segments(chain):
        total = [0]

        def count(m: nn.Module, _: Any, out: torch.Tensor, total: list[int] = total) -> None:
            if isinstance(m, nn.Conv2d):
                kh, kw = m.kernel_size
                total[0] += out.numel() * (m.in_channels // m.groups) * kh * kw
            elif isinstance(m, nn.Linear):
                total[0] += m.in_features * m.out_features

        hooks = [m.register_forward_hook(count) for m in segment.modules()
                 if isinstance(m, (nn.Conv2d, nn.Linear))]
        with torch.no_grad():
            out = segment(x)
        for hook in hooks:
            hook.remove()
        x = out[0] if isinstance(out, tuple) else out
        macs.append(total[0])
    return tuple(macs)


# --- measuring the card ---------------------------------------------------------------------


def measure_exits(paths: ExitPaths, trained: Trained, macs: Sequence[int], splits: Splits,
                  profile: BuildProfile) -> ModelCard:
    """Evaluate the exported segments (accuracy, temperature, ECE and cascade curve per
    exit), time each one, choose an operating point; returns the card."""
    limit = profile.eval_samples
    calib = splits.calib.head(limit or len(splits.calib))
    test = splits.test.head(limit or len(splits.test))
    net = measure_net(paths.segments, calib, test, splits.test.input[:32],
                      runs=profile.latency_runs, threads=profile.threads, macs=macs,
                      whole=paths.whole, base_variant=BASE_VARIANT,
                      loss_weights=LOSS_WEIGHTS)
    training = TrainingInfo(
        epochs=exits_recipe(profile).epochs, seed=profile.seed,
        seconds=round(trained.seconds, 2), profile=profile.name,
        torch_version=torch.__version__, train_samples=trained.train_samples,
        calib_samples=len(calib), test_samples=len(test), recipe=exits_fingerprint(profile))
    return with_exit_header(ModelCard(
        name=EXITS_NAME, task=TASK, version=EXITS_VERSION, format="multi-exit",
        params=count_params(trained.net), labels=splits.class_names, training=training,
        multi_exit=net))


def exits_of(card: ModelCard) -> tuple[ExitInfo, ...]:
    assert card.multi_exit is not None  # measure_exits writes it
    return card.multi_exit.exits
