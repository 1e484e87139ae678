"""Where to cut a model: pure latency estimates of split plans (Neurosurgeon style).

A split plan runs the model's head (input -> cut tensor) on this node, encodes the cut
tensor with a feature codec, sends it over the link, and runs the tail upstream. For each
candidate (cut, codec)::

    total = head_ms + continue_share x (encode_ms + transfer(encoded bytes, link)
                                         + queue_ms + decode_ms + tail_ms)

(``continue_share`` is 1 except for a multi-exit model cut at an exit boundary: the inputs
its early exits answer on the device never pay for the second half.)

``transfer`` is :func:`tierlink.estimate.latency.transfer_ms` over the *live* link estimate
(RTT and bandwidth learned from traffic), so when the bandwidth changes the best cut moves.
"All local" is the cut after the last node (no transfer), "all remote" the cut at the input
(the raw input is uploaded with the identity codec). No I/O, no clock: profiles come in as
data (:class:`SegmentProfile` from the nodes' split profiles, :class:`CodecProfile` from
``tierlink split codecs``). Where a segment carries the codec measured on its own features
(:class:`~tierlink.core.types.CodecPoint`: real payload bytes, encode ms on the head's node,
decode ms on the tail's), that is used; the codec's average ratio and per-KB costs only
stand in for cuts that were profiled without codecs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from tierlink.core.types import CodecPoint, LinkView
from tierlink.estimate.latency import transfer_ms

LOCAL_CUT = "<local>"    # the whole model here
REMOTE_CUT = "<input>"   # the whole model upstream, raw input uploaded


@dataclass(frozen=True, slots=True)
class SegmentProfile:
    """One cut of one model: head latency measured on this node, tail latency measured on
    the upstream node, and the cut tensor's FP32 size per sample."""

    cut: str
    head_ms: float
    tail_ms: float
    feature_bytes: int
    codecs: tuple[CodecPoint, ...] = ()  # measured at this cut: encode here, decode upstream
    continue_share: float = 1.0  # multi-exit models: share of inputs no earlier exit answered


@dataclass(frozen=True, slots=True)
class CodecProfile:
    """A feature codec as measured: ``ratio`` = FP32 bytes / encoded bytes; encode and
    decode cost per FP32 kilobyte; ``accuracy_loss`` in points (test split, vs unsplit)."""

    spec: str
    ratio: float
    encode_ms_per_kb: float
    decode_ms_per_kb: float
    accuracy_loss: float = 0.0


IDENTITY = CodecProfile("fp32", 1.0, 0.0, 0.0, 0.0)
# Defaults until a fleet supplies measured ones (`tierlink split codecs`), measured here on
# ReLU features (1 thread): FP16 halves the bytes; per-tensor INT8 quarters them; INT8 then
# zstd reaches 4.5-12x on the zoo's and MobileNetV2's features (5 assumed). None moved
# Fashion-MNIST accuracy by more than 0.03 pt or MobileNetV2's top-1 agreement below 99%.
DEFAULT_CODECS = (IDENTITY, CodecProfile("fp16", 2.0, 0.0034, 0.0024, 0.0),
                  CodecProfile("int8", 3.9, 0.0015, 0.0009, 0.05),
                  CodecProfile("int8+zstd", 5.0, 0.0044, 0.0014, 0.05))


class SplitEstimate(NamedTuple):
    """The expected latency of one (cut, codec) plan and where it goes. (A named tuple: a
    policy prices every cut x codec for every request, and on a device this is cheap to
    make.)"""

    cut: str
    codec: str
    total_ms: float
    head_ms: float
    codec_ms: float
    transfer_ms: float
    tail_ms: float
    wire_bytes: int
    accuracy_loss: float
    continue_share: float = 1.0  # share of inputs that cross the link (early exits answer the rest)


def estimate(segment: SegmentProfile, codec: CodecProfile, link: LinkView,
             queue_ms: float = 0.0) -> SplitEstimate:
    """Expected latency of running ``segment``'s head here and its tail upstream."""
    if segment.cut == LOCAL_CUT:
        return SplitEstimate(LOCAL_CUT, "", segment.head_ms, segment.head_ms, 0.0, 0.0, 0.0,
                             0, 0.0)
    wire, codec_ms = _codec_cost(segment, codec)
    net = transfer_ms(wire, link)
    # Only the inputs that no exit before the cut answered pay for the second half.
    total = segment.head_ms + segment.continue_share * (codec_ms + net + queue_ms
                                                        + segment.tail_ms)
    return SplitEstimate(segment.cut, codec.spec, total, segment.head_ms, codec_ms, net,
                         segment.tail_ms + queue_ms, wire, codec.accuracy_loss,
                         segment.continue_share)


def _codec_cost(segment: SegmentProfile, codec: CodecProfile) -> tuple[int, float]:
    """(payload bytes, encode + decode ms) of ``codec`` at ``segment``'s cut: as measured
    there when profiled, else from the codec's average ratio and per-KB costs."""
    point = next((c for c in segment.codecs if c.codec == codec.spec), None)
    if point is not None:
        return max(1, point.wire_bytes), point.encode_ms + point.decode_ms
    kb = segment.feature_bytes / 1024.0
    return (max(1, int(segment.feature_bytes / max(codec.ratio, 1e-9))),
            kb * (codec.encode_ms_per_kb + codec.decode_ms_per_kb))


def candidates(segments: Sequence[SegmentProfile], codecs: Sequence[CodecProfile],
               link: LinkView, queue_ms: float = 0.0,
               max_accuracy_loss: float = 0.5) -> list[SplitEstimate]:
    """Every admissible (cut, codec) plan, fastest first. Codecs that lose more than
    ``max_accuracy_loss`` points are not considered; the raw-input upload only uses the
    identity codec (the input is what the upstream model expects)."""
    usable = [c for c in codecs if c.accuracy_loss <= max_accuracy_loss] or [IDENTITY]
    out = []
    for seg in segments:
        if seg.cut in (LOCAL_CUT, REMOTE_CUT):
            out.append(estimate(seg, IDENTITY, link, queue_ms))
            continue
        out.extend(estimate(seg, c, link, queue_ms) for c in usable)
    return sorted(out, key=lambda e: (e.total_ms, e.accuracy_loss, e.wire_bytes))


def best(segments: Sequence[SegmentProfile], codecs: Sequence[CodecProfile], link: LinkView,
         queue_ms: float = 0.0, max_accuracy_loss: float = 0.5,
         allow_offload: bool = True) -> SplitEstimate:
    """The fastest admissible plan. ``allow_offload`` False (e.g. a ``local``-privacy
    request when features may not leave the device) leaves only the all-local plan."""
    if not allow_offload:
        local = [s for s in segments if s.cut == LOCAL_CUT]
        return estimate(local[0], IDENTITY, link, queue_ms)
    return candidates(segments, codecs, link, queue_ms, max_accuracy_loss)[0]


def chain_segments(cuts: Sequence[str], head_ms: Sequence[float], tail_ms: Sequence[float],
                   feature_bytes: Sequence[int], input_bytes: int, local_ms: float,
                   remote_ms: float) -> list[SegmentProfile]:
    """Segment profiles for a model cut at ``cuts`` (in order), plus the all-remote plan
    (raw input, ``remote_ms`` upstream) and the all-local plan (``local_ms`` here)."""
    segs = [SegmentProfile(REMOTE_CUT, 0.0, remote_ms, input_bytes)]
    segs += [SegmentProfile(c, h, t, b)
             for c, h, t, b in zip(cuts, head_ms, tail_ms, feature_bytes, strict=True)]
    segs.append(SegmentProfile(LOCAL_CUT, local_ms, 0.0, 0))
    return segs
