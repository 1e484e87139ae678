"""Micro-benchmark of the OIP v2 codec: encode + decode time, JSON vs binary tensor data.

Measures both halves of one hop for FP32 image batches ([1,1,28,28] and [32,1,28,28]):
the request (client encode → server decode) and the response (server encode → client decode).
No network: this is the CPU cost the codec adds per hop.

    .venv/bin/python benchmarks/oip_codec.py [--repeat N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tierlink.transport.oip import (
    HEADER_LENGTH,
    decode_infer_request,
    decode_infer_response,
    encode_infer_request,
    encode_infer_response,
)

SHAPES = [(1, 1, 28, 28), (32, 1, 28, 28)]


@dataclass(frozen=True)
class Row:
    """Timings of one (shape, format) case, in microseconds (median and p90 over repeats)."""

    shape: str
    format: str
    request_bytes: int
    response_bytes: int
    req_encode_us: float
    req_decode_us: float
    resp_encode_us: float
    resp_decode_us: float
    round_trip_us: float  # the four medians added: codec CPU per hop
    round_trip_p90_us: float


def timed(fn: Callable[[], Any], repeat: int) -> list[float]:
    """Per-call wall time in µs of ``fn``, after a short warm-up."""
    for _ in range(min(20, repeat)):
        fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - start) / 1000)
    return samples


def header_length(headers: dict[str, str]) -> int | None:
    value = headers.get(HEADER_LENGTH)
    return None if value is None else int(value)


def measure(shape: tuple[int, ...], binary: bool, repeat: int) -> Row:
    # The response echoes x (same size as the request): the worst case for a split-model hop.
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    req_body, req_headers = encode_infer_request({"input": x}, None, None, binary, binary)
    resp_body, resp_headers = encode_infer_response("m", "1", None, {"logits": x}, None, binary)
    phases = {
        "req_encode": lambda: encode_infer_request({"input": x}, None, None, binary, binary),
        "req_decode": lambda: decode_infer_request(req_body, header_length(req_headers)),
        "resp_encode": lambda: encode_infer_response("m", "1", None, {"logits": x}, None, binary),
        "resp_decode": lambda: decode_infer_response(resp_body, header_length(resp_headers)),
    }
    samples = {name: timed(fn, repeat) for name, fn in phases.items()}
    totals = [sum(parts) for parts in zip(*samples.values(), strict=True)]
    medians = {name: statistics.median(values) for name, values in samples.items()}
    return Row(
        shape="x".join(map(str, shape)),
        format="binary" if binary else "json",
        request_bytes=len(req_body),
        response_bytes=len(resp_body),
        req_encode_us=medians["req_encode"],
        req_decode_us=medians["req_decode"],
        resp_encode_us=medians["resp_encode"],
        resp_decode_us=medians["resp_decode"],
        round_trip_us=sum(medians.values()),
        round_trip_p90_us=statistics.quantiles(totals, n=10)[-1],
    )


def print_table(rows: list[Row]) -> None:
    header = [
        "shape",
        "format",
        "req bytes",
        "req enc",
        "req dec",
        "resp enc",
        "resp dec",
        "hop total",
        "hop p90",
    ]
    print(" | ".join(f"{h:>10}" for h in header))
    print("-" * (13 * len(header)))
    for r in rows:
        cells = [r.shape, r.format, str(r.request_bytes)] + [
            f"{v:.1f}"
            for v in (
                r.req_encode_us,
                r.req_decode_us,
                r.resp_encode_us,
                r.resp_decode_us,
                r.round_trip_us,
                r.round_trip_p90_us,
            )
        ]
        print(" | ".join(f"{c:>10}" for c in cells))
    print("times in µs per call (median of repeats); hop total = the four medians added")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeat", type=int, default=300, help="timed calls per phase (default 300)"
    )
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    args = parser.parse_args()
    rows = [measure(shape, binary, args.repeat) for shape in SHAPES for binary in (True, False)]
    print_table(rows)
    if args.json:
        doc = {
            "benchmark": "oip_codec",
            "python": platform.python_version(),
            "numpy": np.__version__,
            "machine": platform.machine(),
            "repeat": args.repeat,
            "rows": [asdict(r) for r in rows],
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
