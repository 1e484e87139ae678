"""The zoo's trainer for ``tierlink retrain`` (``tierlink.trainers``: ``zoo``): fine-tune a
zoo model's weights — read back from its ONNX file — on its training data mixed with the
hard examples the fleet collected. Imports torch.

The zoo's nets are sequential (input normalisation, convolutions with their BatchNorm folded
in, ReLU, max-pooling, a dense head), so :func:`sequential_from_onnx` rebuilds one as a torch
``nn.Sequential`` from the graph and checks that it answers as the file does before anything
is trained; a graph of other operators is refused (register a trainer for such a model).
Fine-tuning is the zoo's loop (:func:`tierlink.zoo.build.train_net`) from those weights,
at a hundredth of the zoo's learning rate, on batches that hold the hard examples at
``hard_share`` (repeated as needed) and the training data for the rest — enough to learn
the hard inputs without forgetting the rest (the caller validates that on held-out data).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from tierlink.core.progress import Reporter
from tierlink.errors import ConfigError, ZooError
from tierlink.models.data import Labelled
from tierlink.retrain.job import TrainJob
from tierlink.zoo.build import export_onnx, teacher_logits, train_net
from tierlink.zoo.nets import Normalize
from tierlink.zoo.profiles import TrainRecipe

__all__ = ["FineTune", "fine_tune", "sequential_from_onnx", "train"]

MATCH_ATOL = 1e-4  # the rebuilt net against the file, on probe inputs


@dataclass(frozen=True, slots=True)
class FineTune:
    """How a zoo model is fine-tuned (the defaults: ``tierlink retrain``'s)."""

    epochs: int = 8
    max_lr: float = 0.001  # a hundredth of the zoo's recipes': the weights are good already
    batch_size: int = 128
    hard_share: float = 0.3  # of each epoch's samples: the hard examples, repeated
    train_samples: int = 12_000  # of the training data per epoch (a seeded subset)
    flips: bool = True  # clothes are left-right symmetric
    # Distilled from a teacher (the task's most capable model) where one is given, as the
    # zoo's device models were trained: (1 - distill) x cross-entropy + distill x KL
    distill: float = 0.7
    seed: int = 0
    # Train anew with the zoo's own recipe for the model's variant, on all the training data
    # and the hard examples at ``hard_share`` (epochs, max_lr and train_samples are then
    # the recipe's): minutes instead of seconds, and not bound to the parent's optimum
    from_scratch: bool = False


def sequential_from_onnx(path: Path) -> nn.Sequential:
    """The zoo net in ``path`` as a torch ``nn.Sequential`` (float32), checked to answer as
    the file does; ``ZooError`` for a graph that is not such a net."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    weights = {t.name: numpy_helper.to_array(t).astype(np.float32)
               for t in model.graph.initializer}
    constants: dict[str, np.ndarray] = {}
    layers: list[nn.Module] = []
    mean = std = None
    for node in model.graph.node:
        op = node.op_type
        if op == "Constant":
            constants[node.output[0]] = numpy_helper.to_array(
                node.attribute[0].t).astype(np.float32)
        elif op in ("Sub", "Div") and node.input[1] in constants:
            value = float(constants[node.input[1]].reshape(-1)[0])
            mean, std = (value, std) if op == "Sub" else (mean, value)
            if mean is not None and std is not None:
                layers.append(Normalize(mean, std))
        elif op == "Conv":
            layers.append(_conv(node, weights))
        elif op == "Relu":
            layers.append(nn.ReLU())
        elif op == "MaxPool":
            kernel = _pair(_ints(node, "kernel_shape"), 1)
            layers.append(nn.MaxPool2d(kernel, _pair(_ints(node, "strides"), kernel[0])))
        elif op == "Flatten":
            layers.append(nn.Flatten())
        elif op == "Gemm":
            layers.append(_dense(node, weights))
        elif op != "Cast":
            raise ZooError(f"{path.name}: operator {op} is not one of a zoo net's",
                           hint="register a trainer for this model (tierlink.trainers)")
    net = nn.Sequential(*layers).eval()
    _check(net, path)
    return net


def _attr(node: object, name: str, default: object = None) -> object:
    from onnx import helper

    for attr in node.attribute:  # type: ignore[attr-defined]
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


def _ints(node: object, name: str) -> tuple[int, ...]:
    value = _attr(node, name, ())
    return tuple(int(v) for v in value) if isinstance(value, list | tuple) else ()


def _pair(values: tuple[int, ...], default: int) -> tuple[int, int]:
    return (values[0], values[1]) if len(values) >= 2 else (default, default)


def _conv(node: object, weights: dict[str, np.ndarray]) -> nn.Conv2d:
    inputs = node.input  # type: ignore[attr-defined]
    w = torch.from_numpy(weights[inputs[1]])
    conv = nn.Conv2d(w.shape[1], w.shape[0], (w.shape[2], w.shape[3]),
                     stride=_pair(_ints(node, "strides"), 1),
                     padding=_pair(_ints(node, "pads"), 0), bias=len(inputs) > 2)
    with torch.no_grad():
        conv.weight.copy_(w)
        if conv.bias is not None:
            conv.bias.copy_(torch.from_numpy(weights[inputs[2]]))
    return conv


def _dense(node: object, weights: dict[str, np.ndarray]) -> nn.Linear:
    inputs = node.input  # type: ignore[attr-defined]
    w = weights[inputs[1]]
    if not _attr(node, "transB", 0):
        w = w.T
    linear = nn.Linear(w.shape[1], w.shape[0])
    with torch.no_grad():
        linear.weight.copy_(torch.from_numpy(np.ascontiguousarray(w)))
        linear.bias.copy_(torch.from_numpy(weights[inputs[2]]))
    return linear


def _check(net: nn.Module, path: Path) -> None:
    from tierlink.models.evaluate import onnx_logits

    probe = np.random.default_rng(0).random((8, 1, 28, 28), dtype=np.float32)
    with torch.no_grad():
        ours = net(torch.from_numpy(probe)).numpy()
    theirs = onnx_logits(path, probe, threads=1).astype(np.float32)
    if ours.shape != theirs.shape or float(np.abs(ours - theirs).max()) > MATCH_ATOL * 100:
        raise ZooError(f"{path.name}: the net rebuilt from its graph does not answer as the "
                       "file does", hint="register a trainer for this model (tierlink.trainers)")


def mixture(train: Labelled, hard: Labelled, settings: FineTune) -> Labelled:
    """One epoch's samples: a seeded subset of ``train`` and ``hard`` repeated to make
    ``hard_share`` of the whole."""
    rng = np.random.default_rng(settings.seed)
    n_train = min(len(train), settings.train_samples)
    base = rng.choice(len(train), n_train, replace=False)
    n_hard = round(settings.hard_share / (1 - settings.hard_share) * n_train)
    extra = rng.choice(len(hard), n_hard, replace=n_hard > len(hard))
    return Labelled.of(np.concatenate([train.input[base], hard.input[extra]]),
                       np.concatenate([train.labels[base], hard.labels[extra]]).astype(np.int64))


def fine_tune(parent: Path, train: Labelled, hard: Labelled, out: Path,
              settings: FineTune = FineTune(), *, teacher: Path | None = None,
              name: str = "", reporter: Reporter | None = None,
              clock: Callable[[], float] | None = None) -> Path:
    """``parent`` fine-tuned on ``train`` and the ``hard`` examples (labels >= 0), written
    to ``out`` (ONNX, checked against the torch net); distilled from ``teacher`` (a model
    file of the same task) where one is given."""
    if len(hard) == 0:
        raise ZooError("no labelled hard examples to learn from",
                       hint="collect some (hard_examples in the fleet file) or label them")
    if settings.from_scratch:
        return _anew(parent, train, hard, out, settings, teacher, name, reporter, clock)
    net = sequential_from_onnx(parent)
    distill = settings.distill if teacher is not None else 0.0
    recipe = TrainRecipe(epochs=settings.epochs, max_lr=settings.max_lr,
                         batch_size=settings.batch_size, flips=settings.flips,
                         distill=distill)
    data = mixture(train, hard, settings)
    soft = teacher_logits(teacher, data, torch.get_num_threads()) \
        if teacher is not None and distill > 0 else None
    reporter = reporter or Reporter.quiet()
    with reporter.phase(f"fine-tune {name or parent.stem}") as phase:
        trained = train_net(out.stem, "", recipe, data, settings.seed, phase,
                            clock or time.perf_counter, make_net=lambda: net, teacher=soft)
    export_onnx(trained.net, out, hard.input[:16])
    return out


def _anew(parent: Path, train: Labelled, hard: Labelled, out: Path, settings: FineTune,
          teacher: Path | None, name: str, reporter: Reporter | None,
          clock: Callable[[], float] | None) -> Path:
    """The parent's variant trained anew with the zoo's recipe for it (``from_scratch``)."""
    from tierlink.models.card import load_card
    from tierlink.zoo.profiles import get_profile

    card = load_card(parent.parent / "card.json")
    profile = get_profile(card.training.profile if card.training else "full")
    recipe = profile.recipe(card.task, card.variant)
    data = mixture(train, hard, replace(settings, train_samples=len(train)))
    soft = teacher_logits(teacher, data, torch.get_num_threads()) \
        if teacher is not None and recipe.distill > 0 else None
    if recipe.distill > 0 and soft is None:
        recipe = replace(recipe, distill=0.0)
    with (reporter or Reporter.quiet()).phase(f"train {name or parent.stem} anew") as phase:
        trained = train_net(out.stem, card.variant, recipe, data, profile.seed, phase,
                            clock or time.perf_counter, task=card.task, teacher=soft)
    export_onnx(trained.net, out, hard.input[:16])
    return out


def train(job: TrainJob) -> Path:
    """The zoo's trainer (``tierlink.trainers``: ``zoo``): :func:`fine_tune` with the job's
    options over the defaults (:class:`FineTune`'s fields), distilled from its teacher."""
    return fine_tune(job.parent, job.train, job.hard, job.out, settings(job.options),
                     teacher=job.teacher, name=job.name, reporter=job.reporter)


def settings(options: Mapping[str, str]) -> FineTune:
    """:class:`FineTune` with ``options`` (text, as the command line gives them) over its
    defaults; ``ConfigError`` naming an unknown or malformed one."""
    known = {f.name: f for f in fields(FineTune)}
    values: dict[str, Any] = {}
    for key, text in options.items():
        if key not in known:
            raise ConfigError(f"the zoo trainer has no option {key!r}",
                              hint=f"options: {', '.join(known)}")
        kind = type(getattr(FineTune(), key))
        try:
            values[key] = (text.lower() in ("1", "true", "yes")) if kind is bool \
                else kind(text)
        except ValueError:
            raise ConfigError(f"the zoo trainer's option {key}={text!r} is not a "
                              f"{kind.__name__}") from None
    return replace(FineTune(), **values)
