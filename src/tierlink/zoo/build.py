"""Train, export, verify and profile the zoo's models. Imports torch: only ``ensure_zoo``
imports this module, and only when a build is needed.

Reproducible: every model is trained from ``profile.seed`` (weights from
``torch.manual_seed``, data order and flips from a seeded generator) on a fixed number of
threads, inside ``torch.random.fork_rng`` so the caller's random state is left untouched.
Files are written under a temporary name and renamed, the card last: a card on disk
always describes a complete, verified ``.onnx``.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import torch
from torch import nn

from tierlink.core.progress import Phase, Reporter
from tierlink.errors import ZooError
from tierlink.models.calibration import calibrated_card
from tierlink.models.card import ModelCard, TrainingInfo, file_sha256, save_card
from tierlink.models.data import Labelled, Splits
from tierlink.models.evaluate import accuracy, cascade_curve, onnx_logits
from tierlink.models.evaluate import latency as timed
from tierlink.models.layout import CARD_FILE, MODEL_FILE, Layout
from tierlink.models.onnx import ort_session
from tierlink.models.tensors import TensorDecl
from tierlink.zoo.datasets import load_splits
from tierlink.zoo.nets import NUM_CLASSES, build_net, count_params, fold_linear_batchnorm
from tierlink.zoo.profiles import (
    MODEL_VERSION,
    TEACHER,
    VARIANT_TIERS,
    BuildProfile,
    TrainRecipe,
    build_order,
    model_names,
    recipe_fingerprint,
)

OPSET = 17
INPUT = TensorDecl("input", "FP32", (-1, 1, 28, 28))
OUTPUT = TensorDecl("logits", "FP32", (-1, NUM_CLASSES))
EXPORT_ATOL = 1e-4

Clock = Callable[[], float]
# loss(net outputs, labels (B,)) -> a scalar tensor to minimise
LossFn = Callable[[Any, torch.Tensor], torch.Tensor]


@dataclass(frozen=True, slots=True)
class Trained:
    """A trained net (eval mode, contiguous memory) and how long training took."""

    net: nn.Sequential
    seconds: float
    train_samples: int


def build_zoo(task: str, profile: BuildProfile, out_dir: Path, reporter: Reporter, *,
              names: Collection[str] | None = None, splits: Splits | None = None,
              clock: Clock = time.perf_counter) -> dict[str, ModelCard]:
    """Build the models ``names`` of ``task`` (default: all) into ``out_dir`` from the
    task's splits (default: :func:`load_splits`), a phase of ``reporter`` per model;
    returns their cards by model name."""
    wanted = model_names(task) if names is None else tuple(names)
    splits = load_splits(task) if splits is None else splits
    out_dir.mkdir(parents=True, exist_ok=True)
    cards = {}
    variants = dict(zip(VARIANT_TIERS, model_names(task), strict=True))
    for variant in build_order(tuple(VARIANT_TIERS), profile, task):  # teachers first
        if variants[variant] in wanted:
            cards[variants[variant]] = build_model(task, variant, splits, profile, out_dir,
                                                   reporter, clock=clock)
    return cards


def build_model(task: str, variant: str, splits: Splits, profile: BuildProfile,
                out_dir: Path, reporter: Reporter, *,
                clock: Clock = time.perf_counter) -> ModelCard:
    """Train one variant, export and verify its ONNX graph, measure it, write its card:
    installed whole as ``<out_dir>/<name>/<MODEL_VERSION>/`` (the framework's layout).
    One phase of ``reporter``: the training batches counted, then export and evaluation
    (blocking: its heartbeat says they are still working)."""
    name = f"{task}-{variant}"
    with reporter.phase(name, heartbeat=True) as phase:
        card = _build_model(name, task, variant, splits, profile, out_dir, phase, clock)
        phase.finish(f"test {100 * card.test_accuracy:.2f}%, "
                     f"{card.latency_ms['batch1_p50']:.2f} ms")
    return card


def _build_model(name: str, task: str, variant: str, splits: Splits, profile: BuildProfile,
                 out_dir: Path, phase: Phase, clock: Clock) -> ModelCard:
    train = splits.train.head(profile.train_samples or len(splits.train))
    recipe = profile.recipe(task, variant)
    teacher_path = out_dir / f"{task}-{TEACHER}" / MODEL_VERSION / MODEL_FILE
    teacher = (teacher_logits(teacher_path, train, profile.threads)
               if recipe.distill > 0 else None)
    with Layout(out_dir).installing(name, MODEL_VERSION) as staging:
        with _torch_threads(profile.threads), torch.random.fork_rng(devices=[]):
            trained = train_net(name, variant, recipe, train, profile.seed,
                                phase, clock, task=task, teacher=teacher)
            onnx_path = staging / MODEL_FILE
            phase.stage("exporting")
            export_onnx(trained.net, onnx_path, check_on=splits.calib.input[:64])
        phase.stage("evaluating")
        card = measure_card(task, variant, onnx_path, trained, splits, profile)
        save_card(card, staging / CARD_FILE)
    return card


@contextmanager
def _torch_threads(threads: int) -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def teacher_logits(path: Path, data: Labelled, threads: int) -> tuple[np.ndarray, np.ndarray]:
    """The teacher's logits on ``data`` as it is and mirrored (what a flipped batch shows
    the student): (N, 10) each."""
    if not path.exists():
        raise ZooError(f"{path.parent.parent.name} must be built before the models distilled "
                       "from it",
                       hint="build the task's whole zoo: `tierlink zoo build`")
    mirrored = np.ascontiguousarray(data.input[..., ::-1])
    return (onnx_logits(path, data.input, threads=threads),
            onnx_logits(path, mirrored, threads=threads))


def train_net(name: str, variant: str, recipe: TrainRecipe, data: Labelled, seed: int,
              progress: Phase, clock: Clock = time.perf_counter, *,
              task: str = "fmnist", make_net: Callable[[], nn.Module] | None = None,
              loss_fn: LossFn = nn.functional.cross_entropy,
              teacher: tuple[np.ndarray, np.ndarray] | None = None) -> Trained:
    """Train a fresh ``variant`` net of ``task`` (its input normalisation) on ``data`` with
    ``recipe`` (partial batches dropped). ``make_net`` replaces ``build_net(variant, task)``
    (called after seeding, so its weights are seeded too) and ``loss_fn(net(x), labels)``
    the cross-entropy: the multi-exit net trains with this loop and its joint loss.
    ``teacher``: its logits on ``data`` as is and mirrored (:func:`teacher_logits`), for a
    recipe that distills. ``progress``: the phase that counts the batches."""
    steps = len(data) // recipe.batch_size
    if steps == 0:
        raise ZooError(f"{name}: {len(data)} training images is less than one batch")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    # channels_last: oneDNN's fast path on CPU, ~2x faster for these nets than NCHW.
    fresh = build_net(variant, task) if make_net is None else make_net()
    net = fresh.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    opt = NesterovSGD(list(net.parameters()), recipe.weight_decay)
    images, labels = torch.from_numpy(data.input), torch.from_numpy(data.labels)
    soft = None if teacher is None else (torch.from_numpy(teacher[0]),
                                         torch.from_numpy(teacher[1]))
    if recipe.distill > 0 and soft is None:
        raise ZooError(f"{name}: its recipe distills, but no teacher logits were given")
    progress.update(completed=0, total=recipe.epochs * steps, status="training")
    start = clock()
    net.train()
    for epoch in range(recipe.epochs):
        # (steps, B): this epoch's batches, a seeded permutation.
        order = torch.randperm(len(data), generator=gen)[: steps * recipe.batch_size]
        for i, idx in enumerate(order.view(steps, recipe.batch_size)):
            x, mirror = _augment(images[idx], recipe.flips, gen)  # (B, 1, 28, 28), (B,)
            lr, momentum = one_cycle(epoch * steps + i, recipe.epochs * steps, recipe.max_lr)
            step_loss = loss_fn if soft is None else _distilled(
                torch.where(mirror[:, None], soft[1][idx], soft[0][idx]), recipe)
            loss = _step(net, x, labels[idx], name, step_loss)
            opt.step(lr, momentum)
            progress.advance(status=f"epoch {epoch + 1}/{recipe.epochs} loss {loss:.3f}")
    seconds = clock() - start
    net = net.eval().to(memory_format=torch.contiguous_format)  # type: ignore[call-overload]
    return Trained(net, seconds, steps * recipe.batch_size)


def one_cycle(step: int, total: int, max_lr: float) -> tuple[float, float]:
    """(learning rate, momentum) at ``step`` of ``total``, as PyTorch's ``OneCycleLR`` with
    its defaults: cosine warm-up over 30% of the steps from max_lr/25 to max_lr while
    momentum falls 0.95 -> 0.85, then cosine annealing to max_lr/25e4, momentum back up."""
    peak = 0.3 * total - 1
    if step <= peak:
        pct = step / peak if peak > 0 else 1.0
        return _cos(max_lr / 25, max_lr, pct), _cos(0.95, 0.85, pct)
    pct = min(1.0, (step - peak) / max(total - 1 - peak, 1e-9))
    return _cos(max_lr, max_lr / 25e4, pct), _cos(0.85, 0.95, pct)


def _cos(start: float, end: float, pct: float) -> float:
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)


class NesterovSGD:
    """SGD with Nesterov momentum and L2 weight decay, computed as ``torch.optim.SGD`` does
    (dampening 0, the first step seeds the buffer). Hand-written because the first use of a
    ``torch.optim`` optimizer imports ``torch._dynamo``: seconds of start-up per build."""

    def __init__(self, params: list[torch.Tensor], weight_decay: float) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.weight_decay = weight_decay
        self._buffers: list[torch.Tensor | None] = [None] * len(self.params)

    @torch.no_grad()
    def step(self, lr: float, momentum: float) -> None:
        """Apply and clear the gradients."""
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            grad = p.grad.add(p, alpha=self.weight_decay)
            buf = self._buffers[i]
            if buf is None:
                buf = self._buffers[i] = grad.clone()
            else:
                buf.mul_(momentum).add_(grad)
            p.add_(grad.add(buf, alpha=momentum), alpha=-lr)
            p.grad = None


def _augment(x: torch.Tensor, flips: bool,
             gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch, each image mirrored at random when ``flips``; and which ones were."""
    mirror = (torch.rand(x.shape[0], generator=gen) < 0.5 if flips
              else torch.zeros(x.shape[0], dtype=torch.bool))  # (B,)
    if flips:
        x = torch.where(mirror[:, None, None, None], x.flip(3), x)
    return x.contiguous(memory_format=torch.channels_last), mirror


def _distilled(teacher: torch.Tensor, recipe: TrainRecipe) -> LossFn:
    """Cross-entropy on the labels mixed with the KL divergence from the teacher's softened
    answer, scaled by T^2 so its gradients keep their size as T changes."""
    t, w = recipe.distill_temperature, recipe.distill
    target = nn.functional.softmax(teacher / t, dim=1)

    def loss(out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        soft = nn.functional.kl_div(nn.functional.log_softmax(out / t, dim=1), target,
                                    reduction="batchmean")
        return (1 - w) * nn.functional.cross_entropy(out, labels) + w * t * t * soft

    return loss


def _step(net: nn.Module, x: torch.Tensor, y: torch.Tensor, name: str,
          loss_fn: LossFn) -> float:
    loss = loss_fn(net(x), y)
    if not torch.isfinite(loss):
        raise ZooError(f"{name}: training diverged (loss {loss.item()})",
                       hint="lower max_lr in the profile's recipe")
    loss.backward()
    return float(loss.item())


def export_onnx(net: nn.Sequential, path: Path, check_on: np.ndarray) -> None:
    """Export ``net`` (an eval-mode ``nn.Sequential``) with the TorchScript exporter, which
    folds BatchNorm into the convolutions (and :func:`fold_linear_batchnorm` into the dense
    head); verify ONNX Runtime agrees with the unfolded torch net on ``check_on`` (within
    ``EXPORT_ATOL``) before the file takes its final name."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
            torch.onnx.export(
                fold_linear_batchnorm(net), (torch.zeros(2, 1, 28, 28),), str(tmp), dynamo=False,
                opset_version=OPSET, input_names=[INPUT.name], output_names=[OUTPUT.name],
                dynamic_axes={INPUT.name: {0: "batch"}, OUTPUT.name: {0: "batch"}},
                do_constant_folding=True)
    except Exception as exc:  # the exporter raises many unrelated types
        tmp.unlink(missing_ok=True)
        raise ZooError(f"ONNX export of {path.name} failed: {exc}") from exc
    try:
        _verify(net, tmp, check_on)
    except ZooError:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def _verify(net: nn.Module, path: Path, images: np.ndarray) -> None:
    with torch.no_grad():
        expected = net(torch.from_numpy(images)).numpy()  # (B, 10)
    got = onnx_logits(path, images, threads=1)
    err = float(np.abs(got - expected).max())
    if got.shape != expected.shape or err > EXPORT_ATOL:
        raise ZooError(f"ONNX export of {path.name} disagrees with torch: max |diff| {err:.2e} "
                       f"> {EXPORT_ATOL} (shapes {got.shape} vs {expected.shape})")


def measure_card(task: str, variant: str, onnx_path: Path, trained: Trained, splits: Splits,
                 profile: BuildProfile) -> ModelCard:
    """Evaluate the exported graph (calibration and test accuracy, cascade curve on the
    calibration split) and time it; returns its card."""
    limit = profile.eval_samples
    calib = splits.calib.head(limit or len(splits.calib))
    test = splits.test.head(limit or len(splits.test))
    calib_logits = onnx_logits(onnx_path, calib.input, threads=profile.threads)
    test_logits = onnx_logits(onnx_path, test.input, threads=profile.threads)
    latency = timed(ort_session(onnx_path, threads=1), splits.test.input[:32],
                    runs=profile.latency_runs)
    training = TrainingInfo(
        epochs=profile.recipe(task, variant).epochs, seed=profile.seed,
        seconds=round(trained.seconds, 2), profile=profile.name,
        torch_version=torch.__version__, train_samples=trained.train_samples,
        calib_samples=len(calib), test_samples=len(test),
        recipe=recipe_fingerprint(profile, variant, task))
    card = ModelCard(
        task=task, name=f"{task}-{variant}", variant=variant, version=MODEL_VERSION,
        tier=VARIANT_TIERS[variant], params=count_params(trained.net),
        size_bytes=onnx_path.stat().st_size, sha256=file_sha256(onnx_path),
        inputs=(INPUT,), outputs=(OUTPUT,), labels=splits.class_names,
        test_accuracy=accuracy(test_logits, test.labels),
        calib_accuracy=accuracy(calib_logits, calib.labels),
        latency_ms=MappingProxyType({k: round(v, 4) for k, v in latency.items()}),
        cascade=cascade_curve(calib_logits, calib.labels),
        temperature=1.0, training=training)
    return calibrated_card(card, calib_logits, calib.labels, test_logits, test.labels)
