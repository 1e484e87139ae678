"""One row per feature codec: how much smaller than fp32, how fast, and what it costs in answers.

Issue 4's expectation: a codec at least 4x smaller than fp32 at <= 0.5 point accuracy loss on
Fashion-MNIST and >= 99% top-1 agreement on MobileNetV2. Two measurements feed each row:

* Fashion-MNIST: ``fmnist-large`` from the ``full`` zoo, cut after each of its three max-pool
  layers (the mid-network tensors smaller than the first conv's), on the first ``samples``
  test images one at a time (``tierlink.cli.split.codec_report``). Its ratio is the fp32
  payload's size (with its header) over the codec's.
* MobileNetV2 (ImageNet weights), cut after ``features.<k>`` blocks, on the sample photos
  (ten views each by default), reusing ``split_mobilenet.py``'s ``measure_cut``. Its ratio is
  the raw fp32 tensor's bytes over the codec's payload; agreement is top-1 against the
  unsplit model.

Ratios and encode / decode times are means over the cuts measured; accuracy delta (points,
negative = loss) and agreement are the worst cut's. Prints a table, optionally writes JSON::

    .venv/bin/python benchmarks/split_codec_table.py [--json PATH] [--samples 2000]
        [--cuts 3,7,14] [--codecs fp16,int8+zstd] [--fmnist-cuts T1,T2] [--originals-only]

``benchmarks/split.py`` can embed the same dict: ``codec_table()["codecs"]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

FMNIST_MODEL = "fmnist-large"
# After each max-pool of fmnist-large: 32x14x14 (24.5 KiB), 64x7x7 (12.25), 128x3x3 (4.5).
FMNIST_CUTS = ("/4/MaxPool_output_0", "/11/MaxPool_output_0", "/18/MaxPool_output_0")
MOBILENET_CUTS = ("features.3", "features.7", "features.14")
SPECS = ("fp32", "fp16", "int8", "int8+zstd", "int8c+zstd", "fp16+zstd")
TARGET_RATIO = 4.0
TARGET_DELTA_PT = -0.5
TARGET_AGREEMENT = 0.99


@dataclass(frozen=True, slots=True)
class CodecSummary:
    """One codec over every cut measured. ``ratio_fmnist`` / ``ratio_mobilenet`` (fp32 size
    over codec size) and the times are means over the cuts, ``ratio_*_min`` the smallest
    cut's; ``fmnist_accuracy_delta_pt`` (accuracy minus the whole model's, in points) and the
    agreements (share of top-1 equal to the unsplit model's, 0..1) are the worst cut's.
    ``meets_target``: both mean ratios >= 4, delta >= -0.5 pt, MobileNetV2 agreement >= 0.99."""

    codec: str
    ratio_fmnist: float
    ratio_mobilenet: float
    ratio_fmnist_min: float
    ratio_mobilenet_min: float
    encode_ms_mobilenet: float
    decode_ms_mobilenet: float
    encode_us_fmnist: float
    decode_us_fmnist: float
    fmnist_accuracy_delta_pt: float
    fmnist_top1_agreement: float
    mobilenet_top1_agreement: float
    meets_target: bool


def codec_table(specs: Sequence[str] = SPECS, fmnist_samples: int = 2000,
                mobilenet_cuts: Sequence[str] = MOBILENET_CUTS, mobilenet_views: bool = True,
                fmnist_cuts: Sequence[str] = FMNIST_CUTS) -> dict[str, Any]:
    """Measure ``specs`` on Fashion-MNIST and MobileNetV2; JSON-ready ``{"codecs": [...],
    "fmnist": {...}, "mobilenet": {...}, "target": {...}, "seconds"}`` (see the module doc:
    ratios and times are means over the cuts, delta and agreement the worst cut's)."""
    from tierlink.split.codecs import get_codec

    started = time.perf_counter()
    specs = [get_codec(s).spec for s in specs]  # canonical names, so both sides' rows match
    fmnist = _fmnist(specs, fmnist_samples, fmnist_cuts)
    mobilenet = _mobilenet(specs, mobilenet_cuts, mobilenet_views)
    rows = [_summarise(s, fmnist["rows"], mobilenet["rows"]) for s in specs]
    return {"codecs": [asdict(r) for r in rows], "fmnist": fmnist, "mobilenet": mobilenet,
            "target": {"ratio": TARGET_RATIO, "fmnist_accuracy_delta_pt": TARGET_DELTA_PT,
                       "mobilenet_top1_agreement": TARGET_AGREEMENT,
                       "ratio_basis": "mean over the cuts measured, on each model"},
            "met_by": [r.codec for r in rows if r.meets_target],
            "seconds": round(time.perf_counter() - started, 1)}


def _fmnist(specs: Sequence[str], samples: int, cuts: Sequence[str]) -> dict[str, Any]:
    from tierlink.cli.split import codec_report
    from tierlink.models.catalog import Catalog, SourceOptions

    path = Catalog.default(SourceOptions(profile="full")).resolve([FMNIST_MODEL])[
        FMNIST_MODEL].file
    task = "fmnist"
    report = codec_report(path, task, specs, cuts=list(cuts), samples=samples)
    keep = ("tensor", "codec", "payload_bytes", "ratio", "encode_us", "decode_us",
            "accuracy", "delta_pt", "agreement")
    return {"model": FMNIST_MODEL, "samples": report["samples"],
            "accuracy": report["accuracy"],
            "cuts": [{"tensor": c["tensor"], "shape": c["shape"][1:],
                      "kib_fp32": c["bytes_per_sample"] / 1024} for c in report["cuts"]],
            "rows": [{k: r[k] for k in keep} for r in report["rows"]]}


def _mobilenet(specs: Sequence[str], cuts: Sequence[str], views: bool) -> dict[str, Any]:
    from tierlink.models.onnx import ort_session
    from tierlink.zoo.mobilenet import ensure_mobilenet
    from tierlink.zoo.photos import imagenet_photos

    bench = _split_mobilenet()
    model = ensure_mobilenet(progress=True)
    images, _ = imagenet_photos(views=views)  # (N, 3, 224, 224)
    reference = bench.run(ort_session(model, 1), images)  # (N, 1000)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tierlink-codectable-") as tmp:
        for tensor in cuts:
            rows += bench.measure_cut(model, tensor, images, reference, list(specs), Path(tmp))
    return {"model": model.name, "cuts": list(cuts), "inputs": len(images), "rows": rows}


def _split_mobilenet() -> ModuleType:
    """``benchmarks/split_mobilenet.py`` as a module, wherever this script is run from."""
    path = Path(__file__).with_name("split_mobilenet.py")
    spec = importlib.util.spec_from_file_location("split_mobilenet", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _summarise(spec: str, fmnist_rows: list[dict[str, Any]],
               mobilenet_rows: list[dict[str, Any]]) -> CodecSummary:
    fm = [r for r in fmnist_rows if r["codec"] == spec]
    mn = [r for r in mobilenet_rows if r["codec"] == spec]
    ratio_fm = statistics.fmean(r["ratio"] for r in fm)
    ratio_mn = statistics.fmean(r["ratio"] for r in mn)
    delta = min(r["delta_pt"] for r in fm)
    agree = min(r["agreement"] for r in mn)
    return CodecSummary(
        codec=spec, ratio_fmnist=ratio_fm, ratio_mobilenet=ratio_mn,
        ratio_fmnist_min=min(r["ratio"] for r in fm),
        ratio_mobilenet_min=min(r["ratio"] for r in mn),
        encode_ms_mobilenet=statistics.fmean(r["encode_ms"] for r in mn),
        decode_ms_mobilenet=statistics.fmean(r["decode_ms"] for r in mn),
        encode_us_fmnist=statistics.fmean(r["encode_us"] for r in fm),
        decode_us_fmnist=statistics.fmean(r["decode_us"] for r in fm),
        fmnist_accuracy_delta_pt=delta,
        fmnist_top1_agreement=min(r["agreement"] for r in fm),
        mobilenet_top1_agreement=agree,
        meets_target=bool(min(ratio_fm, ratio_mn) >= TARGET_RATIO
                          and delta >= TARGET_DELTA_PT and agree >= TARGET_AGREEMENT))


def print_table(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    fm, mn = doc["fmnist"], doc["mobilenet"]
    table = Table(title="feature codecs (ratios, times: mean over cuts; Δ, agreement: worst cut)",
                  caption=f"FM: {fm['model']}, {fm['samples']} test images, cuts "
                          f"{', '.join(c['tensor'] for c in fm['cuts'])}; MN: MobileNetV2, "
                          f"{mn['inputs']} photos, cuts {', '.join(mn['cuts'])}")
    for col in ("codec", "ratio FM", "ratio MN", "enc µs FM", "dec µs FM", "enc ms MN",
                "dec ms MN", "Δ pt FM", "agree FM", "agree MN", "target"):
        table.add_column(col, justify="left" if col == "codec" else "right",
                         no_wrap=col == "codec")
    for r in doc["codecs"]:
        table.add_row(r["codec"], f"{r['ratio_fmnist']:.2f}x", f"{r['ratio_mobilenet']:.2f}x",
                      f"{r['encode_us_fmnist']:.0f}", f"{r['decode_us_fmnist']:.0f}",
                      f"{r['encode_ms_mobilenet']:.2f}", f"{r['decode_ms_mobilenet']:.2f}",
                      f"{r['fmnist_accuracy_delta_pt']:+.2f}",
                      f"{100 * r['fmnist_top1_agreement']:.2f}%",
                      f"{100 * r['mobilenet_top1_agreement']:.1f}%",
                      "yes" if r["meets_target"] else "no")
    console = Console(width=None if sys.stdout.isatty() else 120)  # piped: not 80 columns
    console.print(table)
    console.print(f"target (>= {TARGET_RATIO:g}x on both, Δ >= {TARGET_DELTA_PT} pt, "
                    f">= {100 * TARGET_AGREEMENT:g}% agreement) met by: "
                    f"{', '.join(doc['met_by']) or 'none'}; {doc['seconds']} s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the table to this JSON file")
    parser.add_argument("--samples", type=int, default=2000,
                        help="Fashion-MNIST test images per cut (default 2000)")
    parser.add_argument("--cuts", default=",".join(c.split(".")[1] for c in MOBILENET_CUTS),
                        help="MobileNetV2 blocks to cut after, e.g. 3,7,14 (or features.3,...)")
    parser.add_argument("--fmnist-cuts", default=",".join(FMNIST_CUTS),
                        help="fmnist-large cut tensors, comma separated")
    parser.add_argument("--codecs", default=",".join(SPECS), help="codec specs, comma separated")
    parser.add_argument("--originals-only", action="store_true",
                        help="one centre crop per photo instead of ten views (fast)")
    return parser.parse_args(argv)


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    blocks = [c if c.startswith("features.") else f"features.{c}" for c in _split(args.cuts)]
    doc = codec_table(_split(args.codecs), args.samples, blocks, not args.originals_only,
                      _split(args.fmnist_cuts))
    print_table(doc)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
