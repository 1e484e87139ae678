"""Split a real ImageNet network at its block boundaries: which feature codec keeps its answers?

MobileNetV2 with torchvision's ImageNet weights (``tierlink.zoo.mobilenet``) is cut after
each ``features[k]`` block (tensor ``features.<k>``). On the sample photos (10 views each of
the photos scikit-image and matplotlib ship, ``tierlink.zoo.photos``) every cut runs head ->
codec -> tail, one payload per photo as a device would send it, for every codec. Reported per
(cut, codec): top-1 agreement with the unsplit model (and whether the unsplit top-1 stays in
the top 5), mean payload bytes and compression ratio against the raw fp32 tensor, median
encode / decode milliseconds per photo, and the largest logit difference. Sessions use ONNX
Runtime's default optimisations on one thread (as nodes run them)::

    .venv/bin/python benchmarks/split_mobilenet.py [--json PATH] [--cuts 3,7,14]
        [--codecs fp16,int8+zstd] [--originals-only]

Every cut x 14 codecs x 100 inputs: ~8 min on two shared cores (``--cuts 3,7,14``: ~1.5 min).

Expectation (issue 4): a codec with >= 99% top-1 agreement on MobileNetV2 (and, to pay,
at least 4x smaller than fp32).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from tierlink.models.onnx import ort_session
from tierlink.split.codecs import DEFAULT_SPECS, get_codec
from tierlink.split.partition import cut_points, split_model
from tierlink.zoo.mobilenet import NUM_BLOCKS, ensure_mobilenet, top_k
from tierlink.zoo.photos import imagenet_photos

EXTRA_SPECS = ("topk:0.25", "topk:0.1+zstd", "thr:0.5")
TARGET_AGREEMENT = 0.99
TARGET_RATIO = 4.0


def run(session: Any, x: np.ndarray) -> np.ndarray:
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def measure_codec(spec: str, features: np.ndarray, tail: Any,
                  reference: np.ndarray) -> dict[str, Any]:
    """One (cut, codec) cell: encode / decode each photo's features, run the tail on all."""
    codec = get_codec(spec)
    payloads, decoded, enc_ms, dec_ms = [], [], [], []
    for row in features:
        one = row[None]
        start = time.perf_counter()
        payload = codec.encode(one)
        mid = time.perf_counter()
        decoded.append(codec.decode(payload))
        enc_ms.append((mid - start) * 1e3)
        dec_ms.append((time.perf_counter() - mid) * 1e3)
        payloads.append(len(payload))
    logits = run(tail, np.concatenate(decoded))
    top1 = reference.argmax(1)
    top5 = np.argsort(-logits, axis=1)[:, :5]
    raw = features[0].nbytes
    mean_bytes = float(np.mean(payloads))
    return {"codec": spec, "agreement": float((logits.argmax(1) == top1).mean()),
            "top5_agreement": float((top5 == top1[:, None]).any(1).mean()),
            "payload_bytes": mean_bytes, "ratio": raw / mean_bytes,
            "encode_ms": statistics.median(enc_ms), "decode_ms": statistics.median(dec_ms),
            "max_logit_diff": float(np.abs(logits - reference).max())}


def measure_cut(model: Path, tensor: str, images: np.ndarray, reference: np.ndarray,
                specs: list[str], tmp: Path) -> list[dict[str, Any]]:
    head_path, tail_path = split_model(model, tensor, tmp / "head.onnx", tmp / "tail.onnx")
    features = run(ort_session(head_path, 1), images)
    tail = ort_session(tail_path, 1)
    rows = []
    for spec in specs:
        row = {"cut": tensor, "block": int(tensor.split(".")[1]),
               "shape": list(features.shape[1:]), "feature_kib": features[0].nbytes / 1024,
               **measure_codec(spec, features, tail, reference)}
        rows.append(row)
        print(f"  {tensor:<12} {spec:<15} agree {row['agreement']:7.1%}  "
              f"{row['payload_bytes'] / 1024:8.1f} KiB  x{row['ratio']:5.1f}  "
              f"enc {row['encode_ms']:6.2f} ms  dec {row['decode_ms']:6.2f} ms",
              file=sys.stderr, flush=True)
    return rows


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per cut, the smallest codec at >= 99% agreement; overall, whether the target holds."""
    best: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["agreement"] >= TARGET_AGREEMENT:
            cur = best.get(row["cut"])
            if cur is None or row["payload_bytes"] < cur["payload_bytes"]:
                best[row["cut"]] = row
    ok = [r for r in rows if r["agreement"] >= TARGET_AGREEMENT and r["ratio"] >= TARGET_RATIO]
    return {"best_per_cut": {cut: {k: r[k] for k in ("codec", "agreement", "ratio",
                                                     "payload_bytes")}
                             for cut, r in best.items()},
            "codecs_meeting_target": sorted({r["codec"] for r in ok}),
            "target": {"agreement": TARGET_AGREEMENT, "ratio": TARGET_RATIO},
            "met": bool(ok)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--cuts", default="",
                        help="block numbers to cut after, e.g. 3,7,14 (default: every block)")
    parser.add_argument("--codecs", default="",
                        help="codec specs, comma separated (default: the codecs' default set "
                             f"plus {', '.join(EXTRA_SPECS)})")
    parser.add_argument("--originals-only", action="store_true",
                        help="one centre crop per photo instead of ten views (fast)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    model = ensure_mobilenet(progress=True)
    images, names = imagenet_photos(views=not args.originals_only)
    reference = run(ort_session(model, 1), images)
    originals = [i for i, n in enumerate(names) if ":" not in n]
    predictions = {names[i]: row for i, row in zip(originals, top_k(reference[originals]),
                                                   strict=True)}
    for name, row in predictions.items():
        print(f"{name:<14} " + "; ".join(f"{c} {p:.2f}" for c, p in row), file=sys.stderr)
    blocks = [int(b) for b in args.cuts.split(",") if b] or list(range(NUM_BLOCKS))
    valid = {c.tensor for c in cut_points(model)}
    tensors = [f"features.{k}" for k in blocks if f"features.{k}" in valid]
    specs = [s for s in args.codecs.split(",") if s] or [*DEFAULT_SPECS, *EXTRA_SPECS]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tierlink-mnsplit-") as tmp:
        for tensor in tensors:
            rows += measure_cut(model, tensor, images, reference, specs, Path(tmp))
    summary = summarise(rows)
    print(json.dumps(summary, indent=2))
    doc = {"model": model.name, "photos": len(originals), "inputs": len(images),
           "predictions": {n: [[c, round(p, 4)] for c, p in r] for n, r in predictions.items()},
           "rows": rows, "summary": summary,
           "seconds": round(time.perf_counter() - started, 1)}
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
