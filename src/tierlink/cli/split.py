"""``tierlink split``: where a model can be cut, and what each feature codec costs there.

``list MODEL``: every single-tensor cut (index, tensor, shape, KB per sample in FP32).
``codecs MODEL``: for each cut and codec, on real test-split images pushed one at a time
through head -> encode -> decode -> tail (batch 1, as a device sends them): payload size and
ratio to fp32, encode / decode time per sample, test accuracy against the whole model and
top-1 agreement with it. ``--write FLEET_FILE`` puts what each codec the policy prices
costs (its worst cut's points of changed answers, see :func:`codec_losses`) into the fleet
file's ``routing.split_codec_loss``, as ``tierlink cascade tune`` does with thresholds.

MODEL is a path to an ``.onnx`` file or a zoo model name (``fmnist-large``; ``--profile``).
The lead registers ``app`` as ``tierlink split``.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from tierlink.cli.errors import fail
from tierlink.errors import SplitError, TierlinkError

app = typer.Typer(help="Split computing: a model's cut points and feature codecs.",
                  no_args_is_help=True)
console = Console(stderr=True)
TAIL_BATCH = 500


@dataclass(frozen=True, slots=True)
class CodecRow:
    """One (cut, codec) measurement. Times are medians per sample in µs; ``ratio`` is the
    fp32 payload's size over this codec's (both with their headers); accuracy and
    ``agreement`` (top-1 equal to the whole model) are shares in 0..1 of the samples;
    ``delta_pt`` is accuracy minus the whole model's, in points."""

    cut: int
    tensor: str
    codec: str
    kb_fp32: float
    payload_bytes: float
    ratio: float
    encode_us: float
    decode_us: float
    accuracy: float
    delta_pt: float
    agreement: float


@app.command("list")
def list_cuts(
    model: str = typer.Argument(..., help="an .onnx file or a zoo model name"),
    profile: str = typer.Option("full", help="zoo profile for a model name: full | test"),
    as_json: bool = typer.Option(False, "--json", help="print the cuts as JSON"),
) -> None:
    """Every valid single-tensor cut of MODEL in topological order."""
    from tierlink.split.partition import cut_points

    try:
        path, _ = resolve_model(model, profile, progress=not as_json)
        cuts = cut_points(path)
    except TierlinkError as exc:
        fail(exc)
    if as_json:
        print(json.dumps([c.to_dict() for c in cuts], indent=2))
        return
    table = Table(title=f"cut points of {model}")
    for col in ("cut", "tensor", "after node", "shape", "dtype", "KB/sample"):
        table.add_column(col, justify="right" if col in ("cut", "KB/sample") else "left")
    for c in cuts:
        table.add_row(str(c.index), c.tensor, c.after_node or "(graph input)",
                      "x".join("?" if d < 0 else str(d) for d in c.shape), c.dtype,
                      f"{c.kb_per_sample:.2f}" if c.bytes_per_sample >= 0 else "?")
    Console().print(table)


@app.command("codecs")
def codecs(
    model: str = typer.Argument(..., help="an .onnx file or a zoo model name"),
    cut: list[str] | None = typer.Option(None, "--cut", help="cut tensor (repeat; "
                                         "default: every cut)"),
    codec: list[str] | None = typer.Option(None, "--codec", help="codec spec (repeat; "
                                           "default: a representative set)"),
    samples: int = typer.Option(3000, help="test-split images to push through"),
    task: str = typer.Option("", help="dataset of an .onnx file (default: from the name, "
                             "else fmnist)"),
    profile: str = typer.Option("full", help="zoo profile for a model name: full | test"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
    write: Path | None = typer.Option(None, "--write", metavar="FLEET_FILE",
                                      help="write each codec's measured loss into this fleet "
                                           "file's routing.split_codec_loss"),
) -> None:
    """Compression ratio, encode/decode time and accuracy impact of each codec at each cut,
    on real test images."""
    from tierlink.fleet.fleetfile import write_codec_losses
    from tierlink.split.codecs import DEFAULT_SPECS, get_codec

    try:
        path, zoo_task = resolve_model(model, profile, progress=not as_json)
        specs = [get_codec(s).spec for s in (codec or DEFAULT_SPECS)]
        doc = codec_report(path, task or zoo_task, specs, cuts=cut or None, samples=samples,
                           progress=not as_json)
        doc["model"] = model
        doc["losses"] = codec_losses(doc["rows"])
        if write is not None:
            if not doc["losses"]:
                raise SplitError("none of the measured codecs is one the policy prices",
                                 hint="measure fp16, int8 or int8+zstd (--codec)")
            write_codec_losses(write, doc["losses"],
                               comment=f"measured on {model} by tierlink split codecs")
    except TierlinkError as exc:
        fail(exc)
    doc["written"] = None if write is None else str(write)
    if as_json:
        print(json.dumps(doc, indent=2))
        return
    _print_report(doc)
    if write is not None:
        console.print(f"wrote routing.split_codec_loss {doc['losses']} into {write}")


def codec_losses(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """What ``routing.split_codec_loss`` should say of each codec the policy prices (the
    lossless fp32 excepted): the points of test answers it changed at its worst measured cut
    (top-1 disagreement with the whole model, or the accuracy it lost if that is more), an
    upper bound on the accuracy it can cost. Codecs the policy does not price are left out."""
    from tierlink.estimate.split import DEFAULT_CODECS

    priced = {c.spec for c in DEFAULT_CODECS if c.spec != "fp32"}
    losses: dict[str, float] = {}
    for r in rows:
        if r["codec"] in priced:
            loss = max(100.0 * (1.0 - r["agreement"]), -r["delta_pt"], 0.0)
            losses[r["codec"]] = round(max(loss, losses.get(r["codec"], 0.0)), 3)
    return losses



def resolve_model(model: str, profile: str, progress: bool = False) -> tuple[Path, str]:
    """(the .onnx path, its task) of a path or a model name the catalog resolves (a zoo
    model built if missing; ``store:NAME`` as the task of an imported model, whose own data
    a split tool measures with)."""

    from tierlink.errors import ModelNotFound
    from tierlink.models.catalog import Catalog, SourceOptions
    from tierlink.zoo.profiles import TASKS

    catalog = Catalog.default(SourceOptions(profile=profile, progress=progress))
    path = Path(model)
    offered = any(source.offers(model) for source in catalog.sources)
    if (path.suffix == ".onnx" or path.exists()) and not offered:
        if not path.is_file():
            raise SplitError(f"no model file {path}", hint="pass an .onnx file or a model name")
        return path, next((t for t in TASKS if model.startswith(f"{t}-")), "fmnist")
    try:
        found = catalog.resolve([model])[model]
    except ModelNotFound as exc:
        raise SplitError(f"{model!r} is neither an .onnx file nor a model the catalog has",
                         hint=exc.hint) from exc
    from tierlink.models.card import load_card

    card = load_card(found.card)
    if card.format != "onnx":
        raise SplitError(f"split works on ONNX graphs; {model} is a {card.format} model",
                         hint="export it to ONNX and import that to split it")
    return found.file, (f"store:{model}" if found.source == "store" else card.task)


def codec_report(path: Path, task: str, specs: Sequence[str], *,
                 cuts: Sequence[str] | None = None, samples: int = 3000,
                 progress: bool = False,
                 clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """Measure every codec of ``specs`` at every cut of ``cuts`` (default: all) on the first
    ``samples`` test images of ``task``: JSON-ready ``{"task", "samples", "accuracy",
    "cuts": [CutPoint...], "rows": [CodecRow...]}``."""
    from tierlink.models.evaluate import accuracy, onnx_logits
    from tierlink.split.partition import cut_points

    test = evaluation_images(task, samples)
    whole = onnx_logits(path, test.input)  # (N, classes)
    chosen = _chosen_cuts(cut_points(path), cuts)
    base = accuracy(whole, test.labels)
    rows: list[CodecRow] = []
    with tempfile.TemporaryDirectory(prefix="tierlink-split-") as tmp:
        for point in chosen:
            if progress:
                console.print(f"cut {point.index}: {point.tensor}")
            rows.extend(_measure_cut(path, Path(tmp), point, specs, test, whole, base, clock))
    return {"task": task, "samples": len(test), "accuracy": base,
            "cuts": [c.to_dict() for c in chosen], "rows": [asdict(r) for r in rows]}


def evaluation_images(task: str, samples: int) -> Any:
    """The first ``samples`` labelled inputs a split tool measures with: the zoo task's test
    split, or (``store:NAME``) the evaluation part of an imported classifier's own data."""
    from tierlink.models.data import Labelled
    from tierlink.zoo.datasets import load_splits

    if not task.startswith("store:"):
        return load_splits(task).test.head(samples)
    from tierlink.modelstore.store import ModelStore

    part = ModelStore.default().single_input_classifier(task[6:], "split codecs")
    return Labelled.of(part.input[:samples], part.labels[:samples].astype("int64"))


def _chosen_cuts(all_cuts: list[Any], wanted: Sequence[str] | None) -> list[Any]:
    if not wanted:
        return all_cuts
    by_tensor = {c.tensor: c for c in all_cuts}
    unknown = [t for t in wanted if t not in by_tensor]
    if unknown:
        raise SplitError(f"not single-tensor cuts: {', '.join(unknown)}; valid: "
                         f"{', '.join(by_tensor)}")
    return [by_tensor[t] for t in wanted]


def _measure_cut(path: Path, tmp: Path, point: Any, specs: Sequence[str], test: Any,
                 whole: Any, base: float, clock: Callable[[], float]) -> list[CodecRow]:
    from tierlink.models.evaluate import accuracy
    from tierlink.models.onnx import ort_session
    from tierlink.split.codecs import get_codec
    from tierlink.split.partition import split_model

    head, tail = split_model(path, point.tensor, tmp / "head.onnx", tmp / "tail.onnx")
    features = _run(ort_session(head), test.input)  # (N, *cut shape)
    tail_session = ort_session(tail)
    fp32 = get_codec("fp32")
    fp32_bytes = sum(len(fp32.encode(features[i:i + 1])) for i in range(len(features))) / \
        max(1, len(features))  # the mean: header sizes vary by a few digits
    rows = []
    for spec in specs:
        decoded, size, enc_us, dec_us = _roundtrip(get_codec(spec), features, clock)
        logits = _run(tail_session, decoded)
        acc = accuracy(logits, test.labels)
        agree = float((logits.argmax(axis=1) == whole.argmax(axis=1)).mean())
        rows.append(CodecRow(point.index, point.tensor, spec, point.bytes_per_sample / 1024,
                             size, fp32_bytes / size, enc_us, dec_us, acc,
                             100.0 * (acc - base), agree))
    return rows


def _run(session: Any, x: Any) -> Any:
    """The first output of ``session`` on ``x`` in batches of ``TAIL_BATCH``."""
    import numpy as np

    name = session.get_inputs()[0].name
    chunks = [session.run(None, {name: x[i:i + TAIL_BATCH]})[0]
              for i in range(0, len(x), TAIL_BATCH)]
    return np.concatenate(chunks)


def _roundtrip(codec: Any, features: Any,
               clock: Callable[[], float]) -> tuple[Any, float, float, float]:
    """Encode and decode each sample alone (batch 1): decoded (N, ...), mean payload
    bytes, median encode and decode µs."""
    import numpy as np

    n = len(features)
    enc, dec, sizes = np.empty(n), np.empty(n), np.empty(n)
    out = np.empty_like(features)
    for i in range(n):
        t0 = clock()
        payload = codec.encode(features[i:i + 1])
        t1 = clock()
        out[i:i + 1] = codec.decode(payload)
        enc[i], dec[i], sizes[i] = t1 - t0, clock() - t1, len(payload)
    return out, float(sizes.mean()), 1e6 * float(np.median(enc)), 1e6 * float(np.median(dec))


def _print_report(doc: dict[str, Any]) -> None:
    table = Table(title=f"codecs on {doc['model']} ({doc['samples']} test images, whole "
                        f"model {100 * doc['accuracy']:.2f}%)")
    for col in ("cut", "tensor", "KB fp32", "codec", "bytes", "ratio", "enc µs", "dec µs",
                "acc %", "Δ pt", "agree %"):
        table.add_column(col, justify="left" if col in ("tensor", "codec") else "right")
    for r in doc["rows"]:
        table.add_row(str(r["cut"]), r["tensor"], f"{r['kb_fp32']:.2f}", r["codec"],
                      f"{r['payload_bytes']:.0f}", f"{r['ratio']:.2f}x",
                      f"{r['encode_us']:.0f}", f"{r['decode_us']:.0f}",
                      f"{100 * r['accuracy']:.2f}", f"{r['delta_pt']:+.2f}",
                      f"{100 * r['agreement']:.2f}")
    Console().print(table)
