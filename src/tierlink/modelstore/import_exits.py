"""``tierlink model import NAME DIR --format multi-exit``: a user's multi-exit model — ONNX
segments, each taking the one before's first output and giving an exit's logits last — is
measured on its own labelled data exactly as the zoo's multi-exit net is
(:func:`tierlink.models.exit_measure.measure_net`: per exit accuracy, temperature, ECE and
cascade curve; per segment latency; an operating point), and installed in the model store as
one file, its segments packed into ``model.zip``. The nodes serve it with the ``multi-exit``
runtime: each input answered at its first confident exit, split at an exit boundary as a
head.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

from tierlink.errors import ConfigError, ImportRefused, ModelError
from tierlink.models.card import ModelCard, with_exit_header
from tierlink.models.card_parts import DataInfo
from tierlink.models.data import load_data, split
from tierlink.models.exit_measure import chain_order, measure_net
from tierlink.models.kind_registry import kind_of
from tierlink.models.onnx import open_session
from tierlink.models.package import PACKAGE, pack
from tierlink.models.tensors import TensorDecl, from_ort
from tierlink.modelstore.importer import (
    ImportRequest,
    check_inputs,
    check_outputs,
    install,
    resolve_task,
)
from tierlink.modelstore.store import ModelStore

FORMAT = "multi-exit"


def import_exits(req: ImportRequest, store: ModelStore,
                 say: Callable[[str], None] = lambda m: None) -> ModelCard:
    """Measure, then install; returns the card. ``ImportRefused`` naming the problem (nothing
    is written then)."""
    segments = ordered_segments(Path(req.model))
    first = open_session(segments[0]).session.get_inputs()[0]
    # The chain runs on float32 (as the zoo's net does), whatever the batch size.
    inputs = (TensorDecl(first.name, "FP32", (-1, *from_ort(first).shape[1:])),)
    if not req.outputs:  # what it answers is its exits' logits, whichever exit gave them
        req = replace(req, outputs=MappingProxyType({"scores": "logits"}))
    task = resolve_task(req, store, inputs)
    if task.kind != "classification":
        raise ImportRefused(f"a multi-exit model answers with class logits at each exit; task "
                            f"{task.name!r} is a {task.kind} task")
    check_inputs(task, inputs, req.name)
    say(f"reading {req.data}")
    data = load_data(req.data, [first.name], task.labels)
    parts = split(data, req.calib_share, req.seed)
    say(f"measuring {len(segments)} segments on {len(parts.calib)} calibration + "
        f"{len(parts.test)} evaluation samples")
    try:
        net = measure_net(segments, parts.calib, parts.test, parts.test.input[:32])
    except (ModelError, ConfigError, ValueError) as exc:
        raise ImportRefused(f"the segments fail on the data: {exc}",
                            hint="each segment's first output feeds the next; its last "
                                 "output is its exit's logits (N, classes)") from exc
    card = with_exit_header(ModelCard(
        name=req.name, task=task.name, version=req.version, format=FORMAT, file=PACKAGE,
        tier=req.tier, labels=task.labels, task_spec=task, metric=kind_of(task.kind).metric,
        data=DataInfo(parts.calib.sha256, str(req.data), parts.seed, req.calib_share,
                      len(parts.calib), len(parts.test)), multi_exit=net))
    check_outputs(task, kind_of(task.kind), card.outputs[:1])  # "exit" says which answered
    with tempfile.TemporaryDirectory(prefix="tierlink-import-") as tmp:
        package = Path(tmp) / PACKAGE
        pack([(p, p.name) for p in segments], package)
        blob = package.read_bytes()
        card = replace(card, sha256=hashlib.sha256(blob).hexdigest(), size_bytes=len(blob))
        install(store, card, task, data, package)
    return card


def ordered_segments(directory: Path) -> tuple[Path, ...]:
    """The ``.onnx`` files of ``directory`` in chain order (each takes the one before's
    first output); ``ImportRefused`` when they do not form one chain of two or more."""
    if not directory.is_dir():
        raise ImportRefused(f"{directory} is not a directory of ONNX segments",
                            hint="a multi-exit model is imported from the directory holding "
                                 "its segments")
    files = sorted(directory.glob("*.onnx"))
    if len(files) < 2:
        raise ImportRefused(f"{directory} holds {len(files)} .onnx file(s); a multi-exit model "
                            "has two or more segments")
    ends = {}
    for path in files:
        session = open_session(path).session
        outputs = session.get_outputs()
        if len(outputs) < 1:
            raise ImportRefused(f"{path.name} has no outputs")
        ends[path] = (session.get_inputs()[0].name, outputs[0].name)
    try:
        return chain_order(ends)
    except ValueError as exc:
        raise ImportRefused(f"the segments in {directory} do not form one chain: {exc}",
                            hint="segment k takes segment k-1's first output") from exc

