import pytest

from tierlink.core.types import LinkView
from tierlink.estimate.split import (
    LOCAL_CUT,
    REMOTE_CUT,
    CodecProfile,
    best,
    candidates,
    chain_segments,
    estimate,
)

# A MobileNetV2-like profile on a throttled device: the input is big, mid-network features
# are much smaller, the device is slow and the cloud fast.
SEGMENTS = chain_segments(
    cuts=["block3", "block7", "block14"], head_ms=[20.0, 60.0, 120.0],
    tail_ms=[8.0, 4.0, 1.0], feature_bytes=[294 * 1024, 49 * 1024, 31 * 1024],
    input_bytes=150_528 * 4, local_ms=150.0, remote_ms=10.0)
CODECS = [CodecProfile("fp32", 1.0, 0.0, 0.0),
          CodecProfile("int8", 4.0, 0.01, 0.01, 0.1),
          CodecProfile("topk:0.05", 12.0, 0.05, 0.02, 3.0)]  # too lossy


def link(mbit, rtt=10.0):
    return LinkView("dev", "cloud", rtt_ms=rtt, bandwidth_mbit=mbit)


def test_estimate_adds_head_codec_transfer_queue_and_tail():
    seg = SEGMENTS[2]  # block7
    e = estimate(seg, CODECS[1], link(8.0), queue_ms=3.0)
    wire = 49 * 1024 // 4
    assert e.wire_bytes == wire
    assert e.transfer_ms == pytest.approx(10.0 + wire * 8 / 8000.0)
    assert e.codec_ms == pytest.approx(49 * 0.02)
    assert e.total_ms == pytest.approx(60.0 + e.codec_ms + e.transfer_ms + 3.0 + 4.0)


def test_the_best_cut_moves_with_bandwidth():
    fast = best(SEGMENTS, CODECS, link(1000.0, rtt=2.0))
    assert fast.cut == REMOTE_CUT  # a fat pipe: upload the input, the cloud is fast
    mid = best(SEGMENTS, CODECS, link(20.0))
    assert mid.cut not in (REMOTE_CUT, LOCAL_CUT) and mid.codec == "int8"
    slow = best(SEGMENTS, CODECS, link(0.5))
    assert slow.cut == LOCAL_CUT  # a trickle: stay on the device


def test_lossy_codecs_beyond_the_budget_are_never_chosen():
    plans = candidates(SEGMENTS, CODECS, link(1.0), max_accuracy_loss=0.5)
    assert all(p.codec != "topk:0.05" for p in plans)
    allowed = candidates(SEGMENTS, CODECS, link(1.0), max_accuracy_loss=5.0)
    assert any(p.codec == "topk:0.05" for p in allowed)
    assert [p.total_ms for p in plans] == sorted(p.total_ms for p in plans)


def test_no_offload_leaves_only_the_local_plan():
    choice = best(SEGMENTS, CODECS, link(1000.0, rtt=1.0), allow_offload=False)
    assert choice.cut == LOCAL_CUT and choice.total_ms == 150.0 and choice.wire_bytes == 0
